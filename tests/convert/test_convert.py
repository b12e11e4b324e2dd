#!/usr/bin/python3
"""dsinfer-convert on tiny Hugging Face checkpoints (make_hf_checkpoint.py), V4 and V4.1.

1. Native conversion (FP8 carried as fp8_e4m3_b128 / b32, FP4 experts as mxfp4, BF16 as bf16,
   the Engram tables as fp8_e4m3_r32): every tensor, read back with the NumPy GGUF reader,
   equals the generator's dequantized value exactly, under the GGUF name the test expects;
   the FP8 / FP4 tensors really have those types (no dequantize-requantize).
2. The same weights converted to f32 (--type-all f32): libdsinfer's logits of the two files
   agree within 1e-4 (fake-quant off; the weights are identical values, only the kernels'
   summation differs), top-1 100 %.
3. Converting twice gives identical bytes (and a different --name changes them: the
   comparison is not vacuous).
4. V4.1: the Engram constants (token map from the tokenizer's normalized texts, primes,
   NumPy-drawn multipliers, pad id) equal what DeepSeek's engram.py computes (here in
   Python with unicodedata and NumPy).
5. The llama.cpp (default) and ds4 layouts load (V4: with the MTP file), and their tensors
   equal the native file's where no requantization happened.
6. Peak memory (VmHWM), V4.1: a checkpoint with 8x the experts (about 3x the bytes) converts within the same
   bound (PEAK_MIB) as the small one, and the peak does not grow with the size.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from skip import absent  # noqa: E402
try:
    import numpy as np
except ImportError:
    absent("PYTHON", "python3-numpy missing")

from toolcheck import check, deq, finish, gr, run, tool

HERE = os.path.dirname(os.path.abspath(__file__))
CONV = tool("bin", "dsinfer-convert", env="DSI_CONVERT")
LOGITS = tool("tests", "dsi_logits", env="DSI_LOGITS")
CMP = tool("tests", "dsi_layout_cmp", env="DSI_LAYOUT_CMP")
PY = "/usr/bin/python3"
PEAK_MIB = 64          # converter peak RSS bound (VmHWM; the tiny checkpoints need ~3-10 MiB)
TOL_LOGITS = 1e-4


def convert(src, out, *args):
    o = run(CONV, src, "-o", out, "--quiet", "--stats", *args).stdout
    return int(o.split("peak_rss_kib")[1].split()[0]) // 1024


with tempfile.TemporaryDirectory(prefix="dsi_convert_") as d:
    P = lambda n: os.path.join(d, n)  # noqa: E731
    for arch in ("v4", "v41"):
        hf = P("hf-" + arch)
        run(PY, os.path.join(HERE, "make_hf_checkpoint.py"), "--arch", arch, "--out", hf, "--shards", "3")
        ex = np.load(os.path.join(hf, "expected.npz"))
        nat, nat2, f32 = P(arch + "-native.gguf"), P(arch + "-native2.gguf"), P(arch + "-f32.gguf")
        convert(hf, nat, "--layout", "native")
        convert(hf, nat2, "--layout", "native")
        convert(hf, f32, "--layout", "native", "--type-all", "f32")

        # 1. values and types
        g = gr.GGUFFile(nat)
        want = {k[2:]: ex[k] for k in ex.files if k.startswith("t:")}
        bad, types = [], {}
        for name, v in want.items():
            if name not in g.tensors:
                bad.append(name + " missing")
                continue
            got = deq(g, name)
            types[name] = g.tensors[name].type
            if got.shape != v.shape or not np.array_equal(got.astype(np.float32), v.astype(np.float32)):
                bad.append(name)
        extra = sorted(set(g.tensors) - set(want))
        check(not bad and not extra, "%s native: %d tensors equal the checkpoint's dequantized values%s%s"
              % (arch, len(want), "; differ: %s" % bad[:5] if bad else "", "; unexpected: %s" % extra[:5] if extra else ""))
        fp8 = gr.GGML_FP8_E4M3_B32 if arch == "v41" else gr.GGML_FP8_E4M3_B128
        check(types.get("blk.0.attn_q_a.weight") == fp8 and types.get("blk.0.ffn_gate_exps.weight") == 39 and
              types.get("token_embd.weight") == 30 and
              (arch == "v4" or types.get("blk.1.engram.embd.weight") == gr.GGML_FP8_E4M3_R32),
              "%s native: FP8 kept as %s, FP4 experts as mxfp4, BF16 as bf16%s"
              % (arch, gr.TYPE_NAME.get(fp8, fp8), ", Engram table as fp8_e4m3_r32" if arch == "v41" else ""))

        # 4. Engram constants
        if arch == "v41":
            kv = g.kv
            ok = (np.array_equal(np.asarray(kv["deepseek41.engram.token_map"]), ex["engram_token_map"]) and
                  np.array_equal(np.asarray(kv["deepseek41.engram.primes"]), ex["engram_primes"]) and
                  np.array_equal(np.asarray(kv["deepseek41.engram.multipliers"]).astype(np.int64),
                                 ex["engram_multipliers"]) and
                  int(kv["deepseek41.engram.pad_id"]) == int(ex["engram_pad_id"][0]))
            check(ok, "v41: Engram token map (%d tokens -> %d keys), primes, NumPy multipliers and pad id as engram.py"
                  % (len(ex["engram_token_map"]), int(ex["engram_token_map"].max()) + 1))

        # 2. logits: native types vs f32
        toks = P("tok.bin")
        V = int(g.kv["%s.vocab_size" % ("deepseek41" if arch == "v41" else "deepseek4")])
        np.array((np.arange(100) * 37 + 5) % min(V, 440), dtype="<i4").tofile(toks)
        run(LOGITS, nat, toks, P("a.f32"))
        run(LOGITS, f32, toks, P("b.f32"))
        a, b = np.fromfile(P("a.f32"), "<f4"), np.fromfile(P("b.f32"), "<f4")
        a, b = a.reshape(100, -1), b.reshape(100, -1)
        mx = float(np.abs(a - b).max())
        check(mx <= TOL_LOGITS and (a.argmax(1) == b.argmax(1)).all(),
              "%s: logits of the native-type file vs the f32 file: max |d| %.2e (need <= %.0e), top-1 100 %%"
              % (arch, mx, TOL_LOGITS))

        # 3. determinism
        same = open(nat, "rb").read() == open(nat2, "rb").read()
        other = P(arch + "-other.gguf")
        convert(hf, other, "--layout", "native", "--name", "something else")
        check(same and open(nat, "rb").read() != open(other, "rb").read(),
              "%s: converting twice gives identical bytes (%d bytes)" % (arch, os.path.getsize(nat)))

        # 5. other layouts
        ref = P(arch + "-native-f32mat.gguf")
        convert(hf, ref, "--layout", "native", "--type", "f32")
        for lay in ("llama.cpp", "ds4"):
            f, m = P("%s-%s.gguf" % (arch, lay)), P("%s-%s-mtp.gguf" % (arch, lay))
            convert(hf, f, "--layout", lay, "--mtp-out", m, "--type", "f32")
            args = [CMP, ref, f] + (["--draft", m] if os.path.exists(m) else []) + \
                   (["--no-draft"] if (arch == "v41" and lay == "ds4") else [])
            r = run(*args, ok=False)
            check(r.returncode == 0, "%s %s layout (matrices f32): loads, same tensors as native: %s"
                  % (arch, lay, (r.stdout + r.stderr).strip().split(" between")[0]))

        # 6. memory bound (V4.1: the larger of the two)
        if arch != "v41":
            continue
        big = P("hf-%s-big" % arch)
        run(PY, os.path.join(HERE, "make_hf_checkpoint.py"), "--arch", arch, "--out", big, "--grow", "8")
        size = lambda p: sum(os.path.getsize(os.path.join(p, f)) for f in os.listdir(p) if f.endswith(".safetensors"))  # noqa: E731
        # the default layout (llama.cpp): FP4 carried, FP8 requantized to q8_0 through f32
        peak_small = convert(hf, P("small.gguf"))
        peak_big = convert(big, P("big.gguf"))
        check(peak_small <= PEAK_MIB and peak_big <= PEAK_MIB and peak_big <= peak_small + 16,
              "%s: converter peak RSS %d MiB for %.1f MiB of shards, %d MiB for %.1f MiB (bound %d MiB)"
              % (arch, peak_small, size(hf) / 2**20, peak_big, size(big) / 2**20, PEAK_MIB))
        for f in os.listdir(big):
            os.remove(os.path.join(big, f))

finish("converter")
