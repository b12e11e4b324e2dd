#!/usr/bin/python3
"""Compare two raw float32 logits files ([n_positions][n_vocab], little-endian).

  /usr/bin/python3 tests/reference/compare.py A.bin B.bin --vocab V [--tol 1e-4]

Prints max / mean |diff|, the first position whose max |diff| exceeds --tol, and argmax
agreement.  Exit 0 when max |diff| <= tol, 1 otherwise, 2 on usage / shape errors.
(§10.4: with fake quant off, two correct implementations agree to ~1e-5; with it on,
expect isolated midpoint flips — use dsref.py --trace-midpoints to find them.)
"""

import argparse
import sys

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args(argv)
    a = np.fromfile(args.a, dtype="<f4")
    b = np.fromfile(args.b, dtype="<f4")
    if a.size % args.vocab or b.size % args.vocab or a.size != b.size:
        print("compare: size mismatch (%d vs %d floats, vocab %d)" % (a.size, b.size, args.vocab),
              file=sys.stderr)
        return 2
    a = a.reshape(-1, args.vocab).astype(np.float64)
    b = b.reshape(-1, args.vocab).astype(np.float64)
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        print("compare: non-finite values", file=sys.stderr)
        return 1
    d = np.abs(a - b)
    row = d.max(axis=1)
    bad = np.nonzero(row > args.tol)[0]
    print("positions %d  max|d| %.3e  mean|d| %.3e  argmax agree %.4f"
          % (a.shape[0], d.max(), d.mean(), np.mean(a.argmax(1) == b.argmax(1))))
    if len(bad):
        p = int(bad[0])
        print("first position over tol %g: %d (max|d| %.3e, token %d)"
              % (args.tol, p, row[p], int(d[p].argmax())))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
