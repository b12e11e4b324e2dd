#!/usr/bin/python3
"""dsinfer-quantize (docs/converting.md "Requantizing").

1. Types per class: --type q4_k sets the matrices; --type-experts q2_k overrides one class;
   norms stay f32, small matrices keep their type; the llama.cpp layout puts the V4 MTP in
   its own file; the result loads in libdsinfer.
2. Deterministic: the same command twice gives the same bytes, and -t 1 the same as -t 3.
3. Lossless re-layout: --type keep into the ds4 layout (V4.1: the Engram tables become row264,
   no DSpark; V4: MTP in a second file) and back to native binds exactly the same tensors.
4. An importance matrix (llama.cpp's imatrix .dat) lowers the importance-weighted error of a
   q4_k / q2_k / q6_k / iq4_xs / iq2_xxs tensor against its f32 source, compared with no imatrix (the search is what
   the file buys); --imatrix-energy runs too; --imatrix-text computes one with libdsinfer's
   forward pass over a text: every matrix product is observed, row counts add up (tokens for
   attention, tokens x k for the routed experts, one row per chunk for the head — a prefill
   computes the last position's logits only), and it is saved as a .dat.
5. Refusals: an fp8 type outside the native layout; a truncated imatrix; a bad -t.
"""
import os
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from skip import absent  # noqa: E402
try:
    import numpy as np
except ImportError:
    absent("PYTHON", "python3-numpy missing")

from toolcheck import check, deq, finish, gr, run, tool

MK = os.environ.get("DSI_MKMODEL") or tool("bin", "dsinfer-mkmodel")
QZ = tool("bin", "dsinfer-quantize", env="DSI_QUANTIZE")
CMP = tool("tests", "dsi_layout_cmp", env="DSI_LAYOUT_CMP")
LOGITS = tool("tests", "dsi_logits", env="DSI_LOGITS")


with tempfile.TemporaryDirectory(prefix="dsi_quantize_") as d:
    P = lambda n: os.path.join(d, n)  # noqa: E731
    src4, src41 = P("v4.gguf"), P("v41.gguf")
    run(MK, "--config", "tiny-v4-lcpp", "--type", "f32", "--layout", "native", "-o", src4)
    run(MK, "--config", "tiny-v41", "--type", "f32", "--layout", "native", "-o", src41)

    # 1. classes
    out, mtp = P("q.gguf"), P("q-mtp.gguf")
    run(QZ, src4, "-o", out, "--mtp-out", mtp, "--type", "q4_k", "--type-experts", "q2_k", "--quiet")
    g = gr.GGUFFile(out)
    t = {n: x.type for n, x in g.tensors.items()}
    check(t["blk.0.attn_q_b.weight"] == 12 and t["blk.0.ffn_up_exps.weight"] == 10 and t["blk.0.attn_norm.weight"] == 0
          and t["blk.2.attn_compressor_kv.weight"] == 0 and t["output.weight"] == 12 and os.path.exists(mtp),
          "types per class: attention / head q4_k, experts q2_k, norms and small matrices f32; MTP in its own file")
    toks = P("tok.bin")
    np.arange(5, 69, dtype="<i4").tofile(toks)
    r = run(LOGITS, out, toks, P("x.f32"), "--draft", mtp, ok=False)
    check(r.returncode == 0, "the quantized llama.cpp-layout file (+ MTP file) loads and runs in libdsinfer")

    # 2. determinism
    out2 = P("q2.gguf")
    run(QZ, src4, "-o", out2, "--mtp-out", P("q2-mtp.gguf"), "--type", "q4_k", "--type-experts", "q2_k", "--quiet")
    check(open(out, "rb").read() == open(out2, "rb").read(), "the same command twice gives the same bytes")
    # ... and whatever the thread count (-t splits each tensor's rows over threads): the
    # importance-weighted K-quant and grid searches, plain encoders and copies of kept tensors
    mix = ["--type", "q4_k", "--type-experts", "iq2_xxs", "--type-head", "q6_k", "--imatrix-energy", "--quiet"]
    run(QZ, src41, "-o", P("t1.gguf"), "-t", "1", *mix)
    run(QZ, src41, "-o", P("t3.gguf"), "-t", "3", *mix)
    check(open(P("t1.gguf"), "rb").read() == open(P("t3.gguf"), "rb").read(), "-t 1 and -t 3 give the same bytes")
    for f in ("t1.gguf", "t3.gguf"):
        os.remove(P(f))

    # 3. lossless re-layout and back
    for src, extra in ((src4, []), (src41, ["--no-draft"])):
        a, am, b = P("a.gguf"), P("a-mtp.gguf"), P("b.gguf")
        run(QZ, src, "-o", a, "--mtp-out", am, "--layout", "ds4", "--quiet")
        run(QZ, a, "-o", b, "--layout", "native", "--quiet", *(["--draft", am] if os.path.exists(am) else []))
        r = run(CMP, src, b, *extra, ok=False)
        check(r.returncode == 0, "%s: native -> ds4 -> native with --type keep binds the same tensors: %s"
              % (os.path.basename(src), r.stdout.strip().split(" between")[0]))
        for f in (a, am, b):
            if os.path.exists(f):
                os.remove(f)

    # 4. importance matrix
    g0 = gr.GGUFFile(src4)
    name = "blk.3.attn_q_b.weight"
    w = deq(g0, name).astype(np.float64)
    rng = np.random.default_rng(3)
    imp = np.where(rng.random(w.shape[1]) < 0.1, 100.0, 0.01).astype(np.float32)
    imat = P("imatrix.dat")
    with open(imat, "wb") as f:
        f.write(struct.pack("<i", 1))
        nb = name.encode()
        f.write(struct.pack("<i", len(nb)) + nb + struct.pack("<ii", 1, len(imp)) + imp.tobytes())
    def back_f32(f):
        """The tensor as libdsinfer decodes it (requantized to f32: the reader here knows only
        the older types; lib/quant's decoders are checked against llama.cpp's elsewhere)."""
        if gr.GGUFFile(f).tensors[name].type in (12, 10):
            return deq(gr.GGUFFile(f), name)
        run(QZ, f, "-o", P("back.gguf"), "--layout", "native", "--type", "f32", "--quiet")
        return deq(gr.GGUFFile(P("back.gguf")), name)

    for ty in ("q4_k", "q2_k", "q6_k", "iq4_xs", "iq2_xxs"):
        plain, wtd = P("plain.gguf"), P("wtd.gguf")  # the attention class only: the IQ searches take time
        run(QZ, src4, "-o", plain, "--layout", "native", "--type-attn", ty, "--quiet")
        run(QZ, src4, "-o", wtd, "--layout", "native", "--type-attn", ty, "--imatrix", imat, "--quiet")
        e = lambda f: float((((back_f32(f).astype(np.float64) - w) ** 2) * imp[None, :]).sum())  # noqa: E731
        ep, ew = e(plain), e(wtd)
        check(ew < ep * 0.9, "%s: importance-weighted error of %s with the imatrix %.4g vs %.4g without" % (ty, name, ew, ep))
    r = run(QZ, src4, "-o", P("e.gguf"), "--layout", "native", "--type", "q4_k", "--imatrix-energy", ok=False)
    check(r.returncode == 0 and "with importance" in r.stderr, "--imatrix-energy: " + r.stderr.strip().splitlines()[-1])

    # 4b. importance computed by libdsinfer's forward pass over a text
    text = P("text.txt")
    with open(text, "w") as f:
        f.write(("The quick brown fox jumps over the lazy dog; it reads the text again and again. " * 12) +
                "Numbers 12345, symbols #$%, and more words to pass through the model.\n")
    dat, qi = P("text.dat"), P("qi.gguf")
    r = run(QZ, src4, "-o", qi, "--layout", "native", "--type", "q4_k", "--imatrix-text", text, "--imatrix-ctx", "64",
            "--imatrix-out", dat, ok=False)
    ok = r.returncode == 0 and "importance from" in r.stderr
    ent = {}
    if ok:
        b = open(dat, "rb").read()
        n, off = struct.unpack_from("<i", b, 0)[0], 4
        for _ in range(n):
            ln = struct.unpack_from("<i", b, off)[0]
            nm = b[off + 4:off + 4 + ln].decode()
            nc, nv = struct.unpack_from("<ii", b, off + 4 + ln)
            vals = np.frombuffer(b, "<f4", nv, off + 12 + ln)
            ent[nm] = (nc, vals)
            off += 12 + ln + 4 * nv
    ntok = int(r.stderr.split("importance from ")[1].split()[0]) if ok else 0
    E, k = 8, 2
    # every class of matrix, whichever op runs it (matmul, matmul_multi: the projections of xn,
    # the router with the shared expert's gate and up; the routed experts; the head)
    ok = ok and all(ent.get("blk.%d.%s.weight" % (il, nm), (0,))[0] == ntok
                    for il in (0, 4) for nm in ("attn_q_a", "attn_kv", "attn_q_b", "attn_output_b",
                                                "ffn_gate_inp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"))
    ok = ok and ent.get("blk.0.attn_q_a.weight", (0,))[0] == ntok and \
        ent.get("blk.4.ffn_gate_exps.weight", (0,))[0] == ntok * k and \
        ent.get("blk.4.ffn_down_exps.weight", (0,))[0] == ntok * k and \
        ent.get("output.weight", (0,))[0] == -(-ntok // 64) and \
        len(ent["blk.4.ffn_down_exps.weight"][1]) == 256 * E and \
        all((v >= 0).all() and np.isfinite(v).all() and v.std() > 0 for _, v in ent.values())
    check(ok, "--imatrix-text: %d tokens through the model, %d matrices observed (attention rows = tokens, expert rows = "
          "tokens x %d, head rows = chunks), written as llama.cpp's .dat" % (ntok, len(ent), k))

    # 5. refusals
    r = run(QZ, src4, "-o", P("f.gguf"), "--type", "fp8", ok=False)
    check(r.returncode == 1 and "native layout only" in r.stderr and not os.path.exists(P("f.gguf")),
          "fp8 outside the native layout is refused: " + r.stderr.strip().splitlines()[-1])
    with open(P("bad.dat"), "wb") as f:
        f.write(struct.pack("<i", 2) + struct.pack("<i", 4) + b"blk.")
    r = run(QZ, src4, "-o", P("g.gguf"), "--imatrix", P("bad.dat"), ok=False)
    check(r.returncode == 1 and "bad.dat" in r.stderr, "a truncated imatrix is refused: " + r.stderr.strip().splitlines()[-1])
    for bad in ("0", "257", "2x", ""):
        r = run(QZ, src4, "-o", P("h.gguf"), "-t", bad, ok=False)
        check(r.returncode == 1 and "thread count" in r.stderr and not os.path.exists(P("h.gguf")),
              "-t '%s' is refused: %s" % (bad, r.stderr.strip().splitlines()[-1]))

finish("quantizer")
