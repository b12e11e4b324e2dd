"""Training data: the KJV verses (kjv.py) as a plain token stream and as chat
conversations rendered the way lib/tokenizer/chat.c renders them (docs/tokenizer.md §4):

  BOS <｜User｜>{user}<｜Assistant｜></think>{answer}<｜end▁of▁sentence｜> <｜User｜>...
  last turn with thinking: <｜Assistant｜><think>{reasoning}</think>{answer}<｜end▁of▁sentence｜>

A user turn is either a verse (the answer is the verse that follows it) or a reference such as
"John 3:16" (the answer is that verse); the reasoning of a thinking turn is the reference of the
answer verse. Sampling is driven by numpy Generators seeded with (seed, step), so a resumed run
sees exactly the batches an uninterrupted run would.
"""
import os

import numpy as np

import bpe
import kjv


class Corpus:
    def __init__(self, verses, tok):
        self.tok = tok
        tr_runs, he_runs = kjv.split_runs(verses)
        self.train_runs = [[(ref, txt, tok.encode(txt), tok.encode(txt + "\n"), tok.encode(ref))
                            for ref, txt in run] for run in tr_runs]
        self.held_runs = [[(ref, txt, tok.encode(txt), tok.encode(txt + "\n"), tok.encode(ref))
                           for ref, txt in run] for run in he_runs]
        self.stream, self.starts = self._stream(self.train_runs)
        self.held_stream, self.held_starts = self._stream(self.held_runs)
        self.sp = {k: tok.sid(k) for k in range(len(bpe.SPECIALS))}

    @staticmethod
    def _stream(runs):
        toks, starts = [], []
        for run in runs:
            for v in run:
                starts.append(len(toks))
                toks.extend(v[3])
        return np.asarray(toks, dtype=np.int64), np.asarray(starts, dtype=np.int64)

    def plain(self, rng, n):
        """BOS + the training stream from a random verse start, n tokens in all."""
        s = self.starts[rng.integers(len(self.starts))]
        body = self.stream[s:s + n - 1]
        if len(body) < n - 1:
            body = np.concatenate([body, self.stream[:n - 1 - len(body)]])
        return np.concatenate([[self.sp[bpe.BOS]], body])

    def conversation(self, rng, runs):
        sp = self.sp
        run = runs[rng.integers(len(runs))]
        n_turns = int(rng.integers(1, 4))
        think_last = rng.random() < 0.5
        i = int(rng.integers(len(run)))
        out = [sp[bpe.BOS]]
        for t in range(n_turns):
            by_ref = rng.random() < 0.5
            if by_ref:
                v = run[i % len(run)]
                user, ans = v[4], v
                i += 1
            else:
                if i + 1 >= len(run):
                    i = 0
                user, ans = run[i][2], run[i + 1]
                i += 2
            out += [sp[bpe.USER]] + list(user) + [sp[bpe.ASSISTANT]]
            if think_last and t == n_turns - 1:
                out += [sp[bpe.THINK]] + list(ans[4]) + [sp[bpe.THINK_END]]
            else:
                out += [sp[bpe.THINK_END]]
            out += list(ans[2]) + [sp[bpe.EOS]]
            if len(out) > 400:
                break
        return out

    def chat(self, rng, n, runs=None):
        """Conversations packed one after the other (each from BOS) into n tokens."""
        runs = runs or self.train_runs
        out = []
        while len(out) < n:
            out += self.conversation(rng, runs)
        return np.asarray(out[:n], dtype=np.int64)

    def batch(self, seed, step, B, n, p_chat=0.15):
        rng = np.random.default_rng([seed, step])
        rows = [self.chat(rng, n) if rng.random() < p_chat else self.plain(rng, n) for _ in range(B)]
        return np.stack(rows)

    def held_chunks(self, n, count):
        """`count` held-out sequences of n tokens: BOS + held-out text from verse starts spread
        evenly over the held-out stream (deterministic)."""
        out = []
        last = len(self.held_stream) - n
        cand = self.held_starts[self.held_starts <= last]
        for k in range(count):
            s = cand[(k * len(cand)) // count]
            out.append(np.concatenate([[self.sp[bpe.BOS]], self.held_stream[s:s + n - 1]]))
        return np.stack(out)


def load(workdir, n_vocab, bible_txt=None, log=print, max_verses=0):
    """Reads the Bible, learns (or reloads) the tokenizer of the training split."""
    verses = kjv.read_bible(bible_txt)
    if max_verses:
        verses = verses[:max_verses]
    train, _ = kjv.split(verses)
    mpath = os.path.join(workdir, "merges.txt")
    if os.path.exists(mpath):
        tok = bpe.Tokenizer.load(mpath)
    else:
        texts = [t + "\n" for _, t in train] + [r + "\n" for r, _ in train]
        tok = bpe.train(texts, n_vocab)
        tok.save(mpath + ".tmp")
        os.replace(mpath + ".tmp", mpath)
    if tok.n_vocab != n_vocab:
        raise SystemExit("data: tokenizer has %d tokens, config wants %d" % (tok.n_vocab, n_vocab))
    log("data: %d verses, tokenizer %d tokens" % (len(verses), tok.n_vocab))
    return Corpus(verses, tok)
