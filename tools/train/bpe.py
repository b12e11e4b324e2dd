"""Byte-level BPE tokenizer for the trained models (docs/trained-models.md).

Pre-tokenizer: the joyai-llm split sequence of model-spec §6 / docs/tokenizer.md §2 (three
"isolated" splits applied one after the other, each inside the pieces of the previous one).
Vocabulary: ids 0..255 are the bytes, then the learned merges in rank order, then the
DeepSeek special tokens (model-spec §6). The library finds the specials by their text, so
their ids are ours to choose; BOS/EOS/PAD ids are also written to tokenizer.ggml.*_token_id.
"""
import collections
import heapq

import regex

SPECIALS = [
    "<｜begin▁of▁sentence｜>",   # BOS
    "<｜end▁of▁sentence｜>",     # EOS: ends every assistant turn
    "<｜▁pad▁｜>",               # PAD (also the DSpark noise token of these models)
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
]
BOS, EOS, PAD, USER, ASSISTANT, THINK, THINK_END = range(len(SPECIALS))

_SPLITS = [
    regex.compile(r"\p{N}{1,3}"),
    regex.compile("[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+"),
    regex.compile(r"[!-/:-@\[-`{-~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|"
                  r" ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
]


def pretokenize(text):
    pieces = [text]
    for rx in _SPLITS:
        out = []
        for p in pieces:
            pos = 0
            for m in rx.finditer(p):
                if m.start() > pos:
                    out.append(p[pos:m.start()])
                if m.end() > m.start():
                    out.append(m.group())
                pos = m.end()
            if pos < len(p):
                out.append(p[pos:])
        pieces = out
    return pieces


def byte_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def train(texts, n_vocab):
    """Learns n_vocab - 256 - len(SPECIALS) merges. Most frequent pair first; ties go to
    the smallest (left id, right id); a merge whose bytes already exist is skipped."""
    n_merges = n_vocab - 256 - len(SPECIALS)
    counts = collections.Counter()
    for t in texts:
        counts.update(pretokenize(t))
    words = [list(p.encode("utf-8")) for p in counts]
    freq = [counts[p] for p in counts]
    tok_bytes = [bytes([i]) for i in range(256)]
    known = set(tok_bytes)
    pair_count = collections.Counter()
    where = collections.defaultdict(set)
    for wi, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] += freq[wi]
            where[(a, b)].add(wi)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    banned = set()
    while len(merges) < n_merges and heap:
        negc, pair = heapq.heappop(heap)
        c = pair_count.get(pair, 0)
        if c <= 0 or -negc != c or pair in banned:
            if c > 0 and -negc != c and pair not in banned:
                heapq.heappush(heap, (-c, pair))
            continue
        a, b = pair
        nb = tok_bytes[a] + tok_bytes[b]
        if nb in known:
            banned.add(pair)
            continue
        new = len(tok_bytes)
        tok_bytes.append(nb)
        known.add(nb)
        merges.append(pair)
        touched = collections.Counter()
        for wi in list(where[pair]):
            w = words[wi]
            f = freq[wi]
            for x, y in zip(w, w[1:]):
                pair_count[(x, y)] -= f
                touched[(x, y)] += 0
            out = []
            i = 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(new)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            words[wi] = out
            for x, y in zip(out, out[1:]):
                pair_count[(x, y)] += f
                where[(x, y)].add(wi)
                touched[(x, y)] += 0
        del where[pair]
        pair_count.pop(pair, None)
        for p in touched:
            c2 = pair_count.get(p, 0)
            if c2 > 0:
                heapq.heappush(heap, (-c2, p))
            else:
                pair_count.pop(p, None)
    if len(merges) != n_merges:
        raise SystemExit("bpe: only %d merges learned" % len(merges))
    return Tokenizer(tok_bytes, merges)


class Tokenizer:
    def __init__(self, tok_bytes, merges):
        self.tok_bytes = list(tok_bytes)          # learned tokens (bytes), ids 0..
        self.merges = list(merges)                # (left id, right id) in rank order
        self.n_learned = len(self.tok_bytes)
        self.special_ids = [self.n_learned + i for i in range(len(SPECIALS))]
        self.n_vocab = self.n_learned + len(SPECIALS)
        self.rank = {p: r for r, p in enumerate(self.merges)}
        self.merged = {p: 256 + r for r, p in enumerate(self.merges)}
        self.cache = {}

    def sid(self, k):
        return self.special_ids[k]

    def _bpe(self, piece):
        ids = self.cache.get(piece)
        if ids is not None:
            return ids
        w = list(piece.encode("utf-8"))
        while len(w) > 1:
            best = None
            for i in range(len(w) - 1):
                r = self.rank.get((w[i], w[i + 1]))
                if r is not None and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            w[i:i + 2] = [self.merged[(w[i], w[i + 1])]]
        self.cache[piece] = w
        return w

    def encode(self, text):
        out = []
        for p in pretokenize(text):
            out.extend(self._bpe(p))
        return out

    def decode(self, ids):
        b = bytearray()
        for i in ids:
            if i >= self.n_learned:
                b += SPECIALS[i - self.n_learned].encode("utf-8")
            else:
                b += self.tok_bytes[i]
        return b.decode("utf-8", errors="replace")

    def gguf_tokens(self):
        m = byte_to_unicode()
        toks = ["".join(m[x] for x in tb) for tb in self.tok_bytes] + list(SPECIALS)
        types = [1] * self.n_learned + [3] * len(SPECIALS)
        merges = ["%s %s" % (toks[a], toks[b]) for a, b in self.merges]
        return toks, types, merges

    def save(self, path):
        with open(path, "w", encoding="utf-8") as f:
            for a, b in self.merges:
                f.write("%d %d\n" % (a, b))

    @staticmethod
    def load(path):
        merges = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                a, b = line.split()
                merges.append((int(a), int(b)))
        tb = [bytes([i]) for i in range(256)]
        for a, b in merges:
            tb.append(tb[a] + tb[b])
        return Tokenizer(tb, merges)


def engram_token_map(tok):
    """Engram compressed-token map (model-spec §4.6): each token's text normalised with
    NFKC -> NFD -> strip accents -> lowercase -> collapse [ \\t\\r\\n]+ to " " -> strip (a lone
    " " survives); bytes that are not complete UTF-8 keep the raw GGUF spelling. Distinct keys
    get consecutive ids in token-id order. Returns (map list, compressed vocab size)."""
    import re
    import unicodedata
    toks, _, _ = tok.gguf_tokens()
    keys = {}
    out = []
    for i in range(tok.n_vocab):
        raw = tok.tok_bytes[i] if i < tok.n_learned else SPECIALS[i - tok.n_learned].encode("utf-8")
        text = raw.decode("utf-8", errors="replace")
        if "\ufffd" in text:
            key = toks[i]
        else:
            k = unicodedata.normalize("NFKC", text)
            k = unicodedata.normalize("NFD", k)
            k = "".join(c for c in k if unicodedata.category(c) != "Mn")
            k = k.lower()
            k = re.sub(r"[ \t\r\n]+", " ", k)
            k = "\ue000" if k == " " else k
            k = k.strip().replace("\ue000", " ")
            key = k if k else text
        if key not in keys:
            keys[key] = len(keys)
        out.append(keys[key])
    return out, len(keys)
