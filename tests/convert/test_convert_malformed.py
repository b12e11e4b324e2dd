#!/usr/bin/python3
"""dsinfer-convert refuses malformed checkpoints with a clear message naming the file and the
tensor (docs/converting.md "Input checks"): each case edits a valid tiny checkpoint
(make_hf_checkpoint.py) and expects exit status 1 and the listed words in the message.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("DSI_BUILD_DIR", "")
CONV = os.environ.get("DSI_CONVERT") or os.path.join(BUILD, "bin", "dsinfer-convert")
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from skip import absent  # noqa: E402

if not os.access(CONV, os.X_OK):
    absent("MODELS", "%s not built (DSI_BUILD_DIR)" % CONV)
try:
    import numpy  # noqa: F401
except ImportError:
    absent("PYTHON", "python3-numpy missing")

failed = 0


def shard_of(d, tensor):
    wm = json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"]
    return os.path.join(d, wm[tensor])


def read_st(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def write_st(path, header, data, raw_header=None):
    h = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":")).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def edit_header(d, tensor, fn):
    p = shard_of(d, tensor)
    h, data = read_st(p)
    fn(h)
    write_st(p, h, data)
    return os.path.basename(p)


def case_bad_length(d):
    p = shard_of(d, "embed.weight")
    b = bytearray(open(p, "rb").read())
    b[:8] = struct.pack("<Q", len(b) * 4)
    open(p, "wb").write(bytes(b))
    return [os.path.basename(p), "header length"]


def case_invalid_json(d):
    p = shard_of(d, "embed.weight")
    h, data = read_st(p)
    raw = json.dumps(h, separators=(",", ":")).encode()
    raw = raw[:40] + b"}{" + raw[42:]
    write_st(p, None, data, raw)
    return [os.path.basename(p), "not valid JSON", "column"]


def case_overlap(d):
    def f(h):
        names = sorted(k for k in h if k != "__metadata__")
        a, b = h[names[0]], h[names[1]]
        n = b["data_offsets"][1] - b["data_offsets"][0]
        b["data_offsets"] = [a["data_offsets"][0], a["data_offsets"][0] + n]
    p = edit_header(d, "embed.weight", f)
    return [p, "overlap"]


def case_out_of_range(d):
    def f(h):
        t = h["embed.weight"]
        n = t["data_offsets"][1] - t["data_offsets"][0]
        t["data_offsets"] = [1 << 40, (1 << 40) + n]
    return [edit_header(d, "embed.weight", f), "embed.weight", "beyond the data section"]


def case_wrong_dtype(d):
    def f(h):
        h["layers.0.attn.wq_a.weight"]["dtype"] = "I8"  # an FP8 weight that is not F8_E4M3
    return [edit_header(d, "layers.0.attn.wq_a.weight", f), "layers.0.attn.wq_a.weight", "I8"]


def case_size_mismatch(d):
    def f(h):
        h["norm.weight"]["shape"] = [7]  # bytes no longer match the shape
    return [edit_header(d, "norm.weight", f), "norm.weight", "bytes"]


def case_wrong_shape(d):
    def f(h):
        t = h["layers.1.attn.wkv.weight"]
        t["shape"] = [t["shape"][1], t["shape"][0]]  # same bytes, transposed
    return [edit_header(d, "layers.1.attn.wkv.weight", f), "layers.1.attn.wkv.weight", "config.json says"]


def case_missing_shard(d):
    p = shard_of(d, "norm.weight")
    os.remove(p)
    return [os.path.basename(p), "missing shard"]


def case_config_vocab(d):
    c = json.load(open(os.path.join(d, "config.json")))
    c["vocab_size"] += 100
    json.dump(c, open(os.path.join(d, "config.json"), "w"))
    return ["embed.weight", "config.json says"]


def case_config_layers(d):
    c = json.load(open(os.path.join(d, "config.json")))
    c["num_hidden_layers"] -= 1  # layer 3's tensors are then left over
    json.dump(c, open(os.path.join(d, "config.json"), "w"))
    return ["layers.3.", "not part of the model"]


def case_missing_scale(d):
    p = shard_of(d, "layers.0.attn.wkv.scale")
    h, data = read_st(p)
    del h["layers.0.attn.wkv.scale"]
    write_st(p, h, data)
    wm_path = os.path.join(d, "model.safetensors.index.json")
    wm = json.load(open(wm_path))
    del wm["weight_map"]["layers.0.attn.wkv.scale"]
    json.dump(wm, open(wm_path, "w"))
    return ["layers.0.attn.wkv.weight", "no scale"]


def case_duplicate_key(d):
    p = shard_of(d, "embed.weight")
    h, data = read_st(p)
    raw = json.dumps(h, separators=(",", ":")).encode()
    first = raw.index(b'"embed.weight"')
    end = raw.index(b"}", first) + 1
    dup = raw[first:end]
    raw = raw[:-1] + b"," + dup + b"}"
    write_st(p, None, data, raw)
    return [os.path.basename(p), "duplicate"]


CASES = [case_bad_length, case_invalid_json, case_overlap, case_out_of_range, case_wrong_dtype,
         case_size_mismatch, case_wrong_shape, case_missing_shard, case_config_vocab, case_config_layers,
         case_missing_scale, case_duplicate_key]

with tempfile.TemporaryDirectory(prefix="dsi_convert_bad_") as t:
    base = os.path.join(t, "base")
    subprocess.run(["/usr/bin/python3", os.path.join(HERE, "make_hf_checkpoint.py"), "--arch", "v4", "--out", base,
                    "--shards", "3"], check=True)
    # the untouched checkpoint converts (so each failure below is the edit's)
    r = subprocess.run([CONV, base, "-o", os.path.join(t, "ok.gguf"), "--quiet"], capture_output=True, text=True)
    print(("ok   " if r.returncode == 0 else "FAIL ") + "the unedited checkpoint converts")
    failed += r.returncode != 0
    for case in CASES:
        d = os.path.join(t, case.__name__)
        shutil.copytree(base, d)
        want = case(d)
        r = subprocess.run([CONV, d, "-o", os.path.join(t, "x.gguf"), "--quiet"], capture_output=True, text=True)
        msg = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
        ok = r.returncode == 1 and all(w in msg for w in want) and not os.path.exists(os.path.join(t, "x.gguf"))
        print(("ok   " if ok else "FAIL ") + "%s: %s" % (case.__name__[5:], msg))
        if not ok:
            print("     expected exit 1 and %s in the message; got exit %d" % (want, r.returncode))
        failed += not ok
        shutil.rmtree(d)

print("%d failed" % failed if failed else "all malformed-input checks passed")
sys.exit(1 if failed else 0)
