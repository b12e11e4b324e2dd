#!/usr/bin/python3
"""Seed corpus of fuzz_safetensors: 8-byte data size + header JSON (valid and near-valid)."""
import json
import os
import struct
import sys

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
seeds = []
h = {"__metadata__": {"format": "pt"},
     "a.weight": {"dtype": "F8_E4M3", "shape": [4, 8], "data_offsets": [0, 32]},
     "a.scale": {"dtype": "F8_E8M0", "shape": [1, 1], "data_offsets": [32, 33]},
     "b": {"dtype": "BF16", "shape": [3], "data_offsets": [33, 39]},
     "c": {"dtype": "I8", "shape": [2, 4], "data_offsets": [39, 47]},
     "d": {"dtype": "F32", "shape": [], "data_offsets": [47, 51]},
     "e": {"dtype": "I64", "shape": [0, 5], "data_offsets": [51, 51]}}
seeds.append((51, json.dumps(h)))
seeds.append((51, json.dumps(h) + "    "))
bad = dict(h)
bad["b"] = {"dtype": "BF16", "shape": [3], "data_offsets": [30, 36]}
seeds.append((51, json.dumps(bad)))
seeds.append((10, json.dumps(h)))
seeds.append((0, "{}"))
seeds.append((0, '{"x": {"dtype": "F16", "shape": [1, 2, 3, 4, 5, 6, 7, 8, 9], "data_offsets": [0, 0]}}'))
seeds.append((8, '{"x": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}, "x": 1}'))
seeds.append((8, '{"\\u0000": {"dtype": "BOOL", "shape": [8], "data_offsets": [0, 8]}}'))
for i, (ds, js) in enumerate(seeds):
    with open(os.path.join(out, "seed%02d" % i), "wb") as f:
        f.write(struct.pack("<Q", ds) + js.encode())
