#!/usr/bin/python3
"""Keeps a model's backbone byte-identical when only its draft blocks were retrained
(make_model.sh --drafts-only, docs/trained-models.md):

  splice_drafts.py --base OLD.gguf --new NEW.gguf -o OUT.gguf

NEW is the export of the retrained checkpoint (export.py -> dsinfer-mkmodel --import). Its
header (metadata, tensor names, shapes, types, offsets) must equal OLD's byte for byte, and
every backbone tensor (any name not under `mtp.`) must dequantise to exactly OLD's values —
the export of an unchanged weight re-encodes to the same values, though not always to the
same bytes (the FP8_E4M3_R32 Engram tables: a block can be written with another scale
exponent for the same values). OUT is OLD with the byte ranges of the `mtp.*` tensors taken
from NEW, so everything the backbone computes stays bit-identical. Prints what differed.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ggufmap  # noqa: E402


def ranges(g):
    items = sorted(g.tensors.items(), key=lambda kv: kv[1][2])
    out = {}
    for k, (name, (_, _, off)) in enumerate(items):
        end = items[k + 1][1][2] if k + 1 < len(items) else len(g.buf) - g.data
        out[name] = (g.data + off, g.data + end)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("-o", required=True)
    a = ap.parse_args()
    old, new = ggufmap.GGUF(a.base), ggufmap.GGUF(a.new)
    if len(old.buf) != len(new.buf) or old.data != new.data or old.buf[:old.data] != new.buf[:new.data]:
        raise SystemExit("splice_drafts: %s and %s differ in size or header (metadata, tensor table)"
                         % (a.base, a.new))
    ro = ranges(old)
    out = bytearray(old.buf)
    n_draft = n_same = n_reenc = 0
    changed = 0
    for name, (s, e) in ro.items():
        if name.startswith("mtp."):
            out[s:e] = new.buf[s:e]
            n_draft += 1
            changed += int(np.count_nonzero(np.frombuffer(old.buf[s:e], np.uint8) != np.frombuffer(new.buf[s:e], np.uint8)))
            continue
        if old.buf[s:e] == new.buf[s:e]:
            n_same += 1
            continue
        if not np.array_equal(old.tensor(name), new.tensor(name)):
            raise SystemExit("splice_drafts: backbone tensor %s has other values in %s" % (name, a.new))
        n_reenc += 1
        print("splice_drafts: %s: other bytes, same values (kept %s's bytes)" % (name, a.base))
    tmp = a.o + ".tmp"
    with open(tmp, "wb") as f:
        f.write(bytes(out))
    os.replace(tmp, a.o)
    print("splice_drafts: %s: %d backbone tensors byte-identical in the export, %d re-encoded to the "
          "same values, all %d kept from %s; %d draft tensors from %s (%d bytes changed)"
          % (a.o, n_same, n_reenc, n_same + n_reenc, a.base, n_draft, a.new, changed))


if __name__ == "__main__":
    main()
