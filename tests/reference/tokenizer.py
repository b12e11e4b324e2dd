#!/usr/bin/python3
"""Independent reference of the DeepSeek V4 tokenizer (model-spec.md §6), for cross-checks.

Written from the tokenizer description only (GPT-2 byte-level BPE; the "joyai-llm" /
DeepSeek-V3 pre-tokenizer as three regex splits applied in sequence, matches and the text
between them kept as pieces, the way HF `tokenizers` runs `Split(..., "isolated")`), with
the `regex` module's real Unicode classes and the textbook GPT-2 merge loop (merge every
occurrence of the best-ranked pair, repeat). It reads the vocabulary from a GGUF with its
own small reader. It shares no code with libdsinfer or the other reference files.

Usage:
  tokenizer.py --gguf FILE --cases FILE      each case line: "<flags> <hex bytes>" where
                                             flags is 0 or 1 (1 = parse special tokens);
                                             prints one line of space-separated ids per case
  tokenizer.py --gguf FILE --text TEXT [--special]
Exit status 77 when the `regex` module is missing (the test then skips).
"""

import struct
import sys

try:
    import regex
except ImportError:  # pragma: no cover
    sys.stderr.write("python3-regex is not installed\n")
    sys.exit(77)

# ---- GGUF (metadata only) -------------------------------------------------------------

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}


class _Reader:
    def __init__(self, data):
        self.d = data
        self.p = 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.d, self.p)[0]
        self.p += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.d[self.p:self.p + n]
        self.p += n
        return bytes(s)

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et = self.take("<I")
            n = self.take("<Q")
            return [self.value(et) for _ in range(n)]
        return self.take(_SCALAR[t])


def read_gguf_metadata(path):
    with open(path, "rb") as f:
        data = f.read()
    r = _Reader(data)
    if data[:4] != b"GGUF":
        raise SystemExit("%s: not a GGUF file" % path)
    r.p = 4
    version = r.take("<I")
    if version not in (2, 3):
        raise SystemExit("%s: GGUF version %d" % (path, version))
    r.take("<Q")  # tensor count
    n_kv = r.take("<Q")
    kv = {}
    for _ in range(n_kv):
        key = r.string().decode("utf-8")
        t = r.take("<I")
        kv[key] = r.value(t)
    return kv


# ---- byte-level alphabet ----------------------------------------------------------------

def byte_alphabet():
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + \
        list(range(0xAE, 0xFF + 1))
    out = {}
    extra = 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


BYTE_TO_CHAR = byte_alphabet()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}

# ---- pre-tokenizer ----------------------------------------------------------------------

SPLITS = [
    regex.compile(r"\p{N}{1,3}"),
    regex.compile(r"[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+"),
    regex.compile(r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"
                  r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
                  r"| ?[\p{P}\p{S}]+[\r\n]*"
                  r"|\s*[\r\n]+"
                  r"|\s+(?!\S)"
                  r"|\s+"),
]


def split_isolated(pattern, text):
    pieces = []
    last = 0
    for m in pattern.finditer(text):
        if m.start() > last:
            pieces.append(text[last:m.start()])
        if m.end() > m.start():
            pieces.append(m.group(0))
        last = m.end()
    if last < len(text):
        pieces.append(text[last:])
    return pieces


def pretokenize(text):
    pieces = [text]
    for pat in SPLITS:
        nxt = []
        for p in pieces:
            nxt.extend(split_isolated(pat, p))
        pieces = nxt
    return pieces


# ---- vocabulary and BPE -----------------------------------------------------------------

class Tokenizer:
    def __init__(self, kv):
        tokens = kv["tokenizer.ggml.tokens"]
        merges = kv.get("tokenizer.ggml.merges", [])
        types = kv.get("tokenizer.ggml.token_type")
        self.n = len(tokens)
        self.spelling = [t.decode("utf-8", "surrogateescape") for t in tokens]

        def is_bytelevel(sp):
            return all(c in CHAR_TO_BYTE for c in sp)

        known = ["<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>",
                 "<\uff5c\u2581pad\u2581\uff5c>", "<\uff5cUser\uff5c>", "<\uff5cAssistant\uff5c>",
                 "<think>", "</think>"]
        self.special = set()
        for i, sp in enumerate(self.spelling):
            if types is not None:
                if types[i] in (3, 4):
                    self.special.add(i)
            elif not is_bytelevel(sp) or sp in known:
                self.special.add(i)
        self.bytes_of = []
        for i, sp in enumerate(self.spelling):
            if i not in self.special and is_bytelevel(sp):
                self.bytes_of.append(bytes(CHAR_TO_BYTE[c] for c in sp))
            elif is_bytelevel(sp) and i in self.special:
                self.bytes_of.append(bytes(CHAR_TO_BYTE[c] for c in sp))
            else:
                self.bytes_of.append(sp.encode("utf-8", "surrogateescape"))
        # spelling -> id for BPE (non-special, byte-level; first id wins)
        self.vocab = {}
        for i, sp in enumerate(self.spelling):
            if i in self.special or not is_bytelevel(sp):
                continue
            self.vocab.setdefault(sp, i)
        self.ranks = {}
        for r, m in enumerate(merges):
            a, b = m.decode("utf-8").split(" ")
            if a in self.vocab and b in self.vocab and (a + b) in self.vocab:
                self.ranks.setdefault((a, b), r)
        # literal special matching: longest first at each position
        self.special_texts = sorted(((self.bytes_of[i], i) for i in self.special),
                                    key=lambda x: (-len(x[0]), x[1]))

    def bpe(self, word):
        parts = list(word)
        while len(parts) > 1:
            best = None
            for i in range(len(parts) - 1):
                r = self.ranks.get((parts[i], parts[i + 1]))
                if r is not None and (best is None or r < best[0]):
                    best = (r, parts[i], parts[i + 1])
            if best is None:
                break
            _, a, b = best
            merged = []
            i = 0
            while i < len(parts):
                if i + 1 < len(parts) and parts[i] == a and parts[i + 1] == b:
                    merged.append(a + b)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return [self.vocab[p] for p in parts]

    def encode_plain(self, data):
        text = data.decode("utf-8", "surrogateescape")
        out = []
        for piece in pretokenize(text):
            raw = piece.encode("utf-8", "surrogateescape")
            out.extend(self.bpe("".join(BYTE_TO_CHAR[b] for b in raw)))
        return out

    def encode(self, data, special):
        if not special:
            return self.encode_plain(data)
        out = []
        start = 0
        i = 0
        while i < len(data):
            hit = None
            for txt, tid in self.special_texts:
                if data.startswith(txt, i):
                    hit = (txt, tid)
                    break
            if hit:
                out.extend(self.encode_plain(data[start:i]))
                out.append(hit[1])
                i += len(hit[0])
                start = i
            else:
                i += 1
        out.extend(self.encode_plain(data[start:]))
        return out


def main(argv):
    args = {"--special": False}
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "--special":
            args[a] = True
            i += 1
        else:
            args[a] = argv[i + 1]
            i += 2
    tok = Tokenizer(read_gguf_metadata(args["--gguf"]))
    if "--cases" in args:
        with open(args["--cases"], encoding="ascii") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                flags, _, hx = line.partition(" ")
                ids = tok.encode(bytes.fromhex(hx), flags == "1")
                print(" ".join(str(x) for x in ids))
    else:
        print(" ".join(str(x) for x in tok.encode(args["--text"].encode("utf-8"), args["--special"])))


if __name__ == "__main__":
    main(sys.argv)
