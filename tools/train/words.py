#!/usr/bin/python3
"""Writes the training split's vocabulary of words (lower-cased runs of ASCII letters, from
the verse texts and the references used as thinking text) — tests/model/data/kjv-words.txt."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kjv  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-o", required=True)
    ap.add_argument("--bible", default=None)
    a = ap.parse_args()
    train, _ = kjv.split(kjv.read_bible(a.bible))
    ws = set()
    for ref, text in train:
        ws.update(w.lower() for w in kjv.words(text))
        ws.update(w.lower() for w in kjv.words(ref))
    with open(a.o, "w") as f:
        f.write("# words of the KJV training split (tools/train/words.py), lower-cased\n")
        for w in sorted(ws):
            f.write(w + "\n")
    print("%d words" % len(ws))


if __name__ == "__main__":
    main()
