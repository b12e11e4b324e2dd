#!/usr/bin/python3
"""GGUF interop checks against the real llama.cpp (tests/interop/README.md).

Started by run.sh, which provides LCPP_PEER (lcpp_peer built against npm's libllama.so) and
LCPP_BACKEND_DIR. Every check prints one line; the figures go to WORK/interop-results.txt.

1. A tiny deepseek4 model written by libdsinfer in the llama.cpp layout (f32, MTP in its own
   file) loads in llama.cpp (model and MTP file); its logits agree with libdsinfer's
   (fake-quant off) over 300 positions: top-1 >= 99 %, max |dlogit| <= 1e-3.
2. For each type of TYPES: llama.cpp's own quantizer (llama_model_quantize) writes the file;
   libdsinfer loads it, and
   a. libdsinfer's logits on it equal libdsinfer's logits on llama.cpp's own dequantization of
      it (llama_model_quantize to f32): max |d| <= 1e-4 — the type is decoded exactly as ggml
      decodes it;
   b. llama.cpp and libdsinfer agree on that dequantized f32 file: max |d| <= 1e-3, top-1 >= 99 %;
   c. llama.cpp and libdsinfer on the quantized file itself: reported, with a per-type floor.
      llama.cpp rounds the activations to the weight's dot type (f16, bf16, q8_0, q8_K) inside
      its CPU matmul; libdsinfer multiplies f32 activations. That rounding (visible as
      llama.cpp-quantized vs llama.cpp-dequantized) is the whole difference, so the floors
      are set from it, not from libdsinfer.
3. The MTP block written in llama.cpp's layout (second file, blk.L.nextn.*, fused eh_proj)
   binds in libdsinfer to exactly the tensors of the native file of the same weights
   (dsi_layout_cmp; libdsinfer has no MTP forward pass yet, so no MTP logits exist to compare).
4. Speed of both engines on one bench model (prefill and decode tokens/s, ratio; one thread
   each, same file, same run — a noisy figure on a shared machine, reported, not asserted).

5. The other direction, for each type of TYPES: dsinfer-quantize writes the file (llama.cpp
   layout) from the same f32 model; llama.cpp loads it, and
   a. llama.cpp's dequantization of it gives libdsinfer the same logits as the file itself
      (max |d| <= 1e-4): llama.cpp reads libdsinfer's blocks as libdsinfer does;
   b. llama.cpp and libdsinfer on it: top-1 and mean |d| with the floors of 2c.

Checks 2 and 5 run one job per type on DSI_JOBS threads (default: the CPU count; every program
a job starts uses one thread); their lines are printed in TYPES order, as a serial run would.
Check 4 runs after them, alone.

Adding a type = one entry in TYPES (see README.md).
"""

import argparse
import os
import concurrent.futures
import subprocess
import sys
import time

import numpy as np

# name, llama.cpp ftype id (enum llama_ftype), pure (every matrix gets the ftype's type),
# ggml type id the matrices must have in the file, (min top-1, max mean |d|) for check 2c.
TYPES = [
    ("f16",   1,  False, 1,  (0.97, 0.02)),
    ("bf16",  32, False, 30, (0.93, 0.10)),
    ("q8_0",  7,  False, 8,  (0.88, 0.15)),
    ("q4_k",  15, True,  12, (0.85, 0.25)),
    ("q2_k",  10, True,  10, (0.80, 0.25)),
    ("mxfp4", 38, False, 39, (0.85, 0.20)),  # MXFP4_MOE: experts mxfp4, the rest q8_0
    # the further ggml types (measured 2c top-1 89.5-96.5 %, mean |d| 0.070-0.122 with the
    # zen4 CPU variant, equal to llama.cpp vs itself dequantized on every type)
    ("q4_0",    2,  True,  2,  (0.85, 0.25)),
    ("q4_1",    3,  True,  3,  (0.85, 0.25)),
    ("q5_0",    8,  True,  6,  (0.85, 0.25)),
    ("q5_1",    9,  True,  7,  (0.85, 0.25)),
    ("q3_k",    12, True,  11, (0.85, 0.25)),
    ("q5_k",    17, True,  13, (0.85, 0.25)),
    ("q6_k",    18, True,  14, (0.85, 0.25)),
    ("iq4_nl",  25, True,  20, (0.85, 0.25)),
    ("iq4_xs",  30, True,  23, (0.85, 0.25)),
    ("iq3_xxs", 23, True,  18, (0.82, 0.25)),
    ("iq3_s",   26, True,  21, (0.85, 0.25)),
    ("iq2_xxs", 19, True,  16, (0.85, 0.25)),
    ("iq2_xs",  20, True,  17, (0.85, 0.25)),
    ("iq2_s",   29, True,  22, (0.85, 0.25)),
    ("iq1_s",   24, True,  19, (0.85, 0.25)),
    ("iq1_m",   31, True,  29, (0.85, 0.25)),
    # llama.cpp's own mixes, as community files are made (not pure: llama.cpp picks the type
    # per tensor — Q4_K_M puts q6_k / q8_0 on some tensors, IQ2_XXS q2_k / q4_k / q8_0)
    ("Q4_K_M",  15, False, 12, (0.85, 0.25)),
    ("IQ2_XXS", 19, False, 16, (0.85, 0.25)),
]
# types llama.cpp's quantizer refuses without an importance matrix (lcpp_peer gives a uniform one)
IMATRIX = {"iq3_xxs", "iq2_xxs", "iq2_xs", "iq2_s", "iq1_s", "iq1_m", "IQ2_XXS"}
MIXES = {"Q4_K_M", "IQ2_XXS"}  # llama.cpp ftypes only: not a dsinfer-quantize --type (check 5)

N_POS_F32 = 300      # positions of check 1
N_POS_TYPE = 200     # positions of check 2
TOL_SAME_FILE = 1e-3  # check 1 / 2b: two implementations, f32 weights, fake-quant off
TOL_DECODE = 1e-4     # check 2a: same engine, weights decoded two ways


def selected():
    """TYPES, or those named in ONLY=a,b (by hand)."""
    only = os.environ.get("ONLY")
    return [t for t in TYPES if not only or t[0] in only.split(",")]


class Run:
    def __init__(self, args):
        self.build = args.build
        self.work = args.work
        self.peer = os.environ["LCPP_PEER"]
        self.mk = os.path.join(self.build, "bin", "dsinfer-mkmodel")
        self.dsi = os.path.join(self.build, "tests", "dsi_logits")
        self.cmp = os.path.join(self.build, "tests", "dsi_layout_cmp")
        self.failed = 0
        self.lines = []

    def sh(self, *cmd, quiet=True):
        r = subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            sys.stdout.write(r.stdout + r.stderr[-3000:])
            raise RuntimeError("%s exited %d" % (" ".join(cmd[:3]), r.returncode))
        return r.stdout

    def path(self, name):
        return os.path.join(self.work, name)

    def report(self, ok, text):
        line = ("ok   " if ok else "FAIL ") + text
        print(line, flush=True)
        self.lines.append(line)
        if not ok:
            self.failed += 1

    def replay(self, job):
        """Reports what a per-type job (a Job) found, in order, as if it had run here."""
        for kind, a, b in job.out:
            if kind == "report":
                self.report(a, b)
            else:
                self.lines.append(a)

    def tokens(self, n, name):
        rng = np.random.default_rng(20260928)
        t = rng.integers(3, 1000, n).astype("<i4")
        p = self.path(name)
        t.tofile(p)
        return p

    def logits(self, engine, model, toks, out, n):
        # one thread each: on a shared machine llama.cpp's spinning thread pool can stall for
        # seconds per token when its threads do not get cores (speed is measured in check 4)
        if engine == "lcpp":
            self.sh(self.peer, "logits", model, toks, out, "1")
        else:
            self.sh(self.dsi, model, toks, out, "--threads", "1")
        return np.fromfile(out, dtype="<f4").reshape(n, -1)

    @staticmethod
    def stats(a, b):
        d = np.abs(a.astype(np.float64) - b)
        return d.max(), d.mean(), float((a.argmax(1) == b.argmax(1)).mean())

    def types_in(self, path):
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
        import gguf_reader as gr
        g = gr.GGUFFile(path)
        return {n: t.type for n, t in g.tensors.items()}


class Job:
    """One type's checks, run on a worker thread: its reports and table lines are kept (in
    order) and replayed by the main thread, so the log reads as a serial run would."""

    def __init__(self):
        self.out = []

    def report(self, ok, text):
        self.out.append(("report", ok, text))

    def line(self, text):
        self.out.append(("line", text, None))


def check_lcpp_quantized(r, tt, f32, name, ftype, pure, want_type, min_top1, max_mean):
    """Check 2 for one type: llama.cpp's quantizer writes the file."""
    j = Job()
    q = r.path("tiny-v4-lcpp-%s.gguf" % name)
    deq = r.path("tiny-v4-lcpp-%s-deq.gguf" % name)
    try:
        r.sh(r.peer, "quantize", f32, q, str(ftype), "2", "pure" if pure else "-",
             *(["imatrix"] if name in IMATRIX else []))
        types = r.types_in(q)
        n_have = sum(1 for t in types.values() if t == want_type)
        if n_have == 0:
            j.report(False, "%s: llama.cpp wrote no tensor of type %d" % (name, want_type))
            return j
        if name in MIXES:
            mix = sorted(set(types.values()))
            j.report(len([t for t in mix if t not in (0, 1, 30)]) > 1,
                     "%s: llama.cpp's mix has the ggml types %s" % (name, mix))
        r.sh(r.peer, "quantize", q, deq, "0")  # LLAMA_FTYPE_ALL_F32: ggml's dequantization
        A = r.logits("dsi", q, tt, r.path("%s.dsi" % name), N_POS_TYPE)
        B = r.logits("lcpp", q, tt, r.path("%s.lcpp" % name), N_POS_TYPE)
        C = r.logits("lcpp", deq, tt, r.path("%s-deq.lcpp" % name), N_POS_TYPE)
        D = r.logits("dsi", deq, tt, r.path("%s-deq.dsi" % name), N_POS_TYPE)
    except RuntimeError as e:
        j.report(False, "%s: %s" % (name, e))
        return j
    a_mx, _, a_t = r.stats(A, D)
    b_mx, _, b_t = r.stats(C, D)
    c_mx, c_mean, c_t = r.stats(B, A)
    s_mx, s_mean, s_t = r.stats(B, C)
    j.report(a_mx <= TOL_DECODE and a_t == 1.0,
             "%s (%d tensors): libdsinfer decodes it as ggml does: max |d| %.2e vs the dequantized file (need <= %.0e)"
             % (name, n_have, a_mx, TOL_DECODE))
    j.report(b_mx <= TOL_SAME_FILE and b_t >= 0.99,
             "%s: llama.cpp and libdsinfer on the dequantized file: max |d| %.2e, top-1 %.1f %%" % (name, b_mx, 100 * b_t))
    j.report(c_t >= min_top1 and c_mean <= max_mean,
             "%s: llama.cpp and libdsinfer on the %s file: top-1 %.1f %%, max |d| %.3g, mean |d| %.3g "
             "(floor top-1 %.0f %%, mean <= %.2g; llama.cpp vs itself dequantized: top-1 %.1f %%, mean |d| %.3g)"
             % (name, name, 100 * c_t, c_mx, c_mean, 100 * min_top1, max_mean, 100 * s_t, s_mean))
    j.line("%s | %.2e | %.2e %.1f%% | %.1f%% %.3g %.3g | %.1f%% %.3g"
           % (name, a_mx, b_mx, 100 * b_t, 100 * c_t, c_mx, c_mean, 100 * s_t, s_mean))
    return j


def check_dsi_quantized(r, tt, f32, name, want_type, min_top1, max_mean):
    """Check 5 for one type: dsinfer-quantize writes the file, llama.cpp reads it."""
    j = Job()
    qz = os.path.join(r.build, "bin", "dsinfer-quantize")
    q = r.path("tiny-v4-dsiq-%s.gguf" % name)
    deq = r.path("tiny-v4-dsiq-%s-deq.gguf" % name)
    # the matrices at the type (mxfp4: the experts, the rest q8_0, as llama.cpp's MXFP4_MOE)
    targs = ["--type", "q8_0", "--type-experts", "mxfp4"] if name == "mxfp4" else ["--type", name]
    try:
        r.sh(qz, f32, "-o", q, "--layout", "llama.cpp", "--no-mtp", "--quiet", *targs)
        n_have = sum(1 for t in r.types_in(q).values() if t == want_type)
        if n_have == 0:
            j.report(False, "%s: dsinfer-quantize wrote no tensor of type %d" % (name, want_type))
            return j
        r.sh(r.peer, "quantize", q, deq, "0")  # llama.cpp reads our blocks, writes f32
        A = r.logits("dsi", q, tt, r.path("%s.dsiq.dsi" % name), N_POS_TYPE)
        B = r.logits("lcpp", q, tt, r.path("%s.dsiq.lcpp" % name), N_POS_TYPE)
        D = r.logits("dsi", deq, tt, r.path("%s.dsiq-deq.dsi" % name), N_POS_TYPE)
    except RuntimeError as e:
        j.report(False, "%s (libdsinfer-written): %s" % (name, e))
        return j
    a_mx, _, a_t = r.stats(A, D)
    c_mx, c_mean, c_t = r.stats(B, A)
    j.report(a_mx <= TOL_DECODE and a_t == 1.0,
             "%s (%d tensors, libdsinfer-written): llama.cpp decodes it as libdsinfer does: max |d| %.2e (need <= %.0e)"
             % (name, n_have, a_mx, TOL_DECODE))
    j.report(c_t >= min_top1 and c_mean <= max_mean,
             "%s (libdsinfer-written): llama.cpp and libdsinfer on it: top-1 %.1f %%, max |d| %.3g, mean |d| %.3g "
             "(floor top-1 %.0f %%, mean <= %.2g)" % (name, 100 * c_t, c_mx, c_mean, 100 * min_top1, max_mean))
    j.line("%s | %.2e | %.1f%% %.3g %.3g" % (name, a_mx, 100 * c_t, c_mx, c_mean))
    return j


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    r = Run(ap.parse_args())

    # ---- 1. f32 model in the llama.cpp layout -----------------------------------------------
    f32 = r.path("tiny-v4-lcpp-f32.gguf")
    mtp = r.path("tiny-v4-lcpp-f32-mtp.gguf")
    r.sh(r.mk, "--config", "tiny-v4-lcpp", "--type", "f32", "--layout", "llama.cpp", "-o", f32, "--mtp-out", mtp)
    for p in (f32, mtp):
        try:
            out = r.sh(r.peer, "load", p)
            r.report(True, "llama.cpp loads %s: %s" % (os.path.basename(p), out.strip().split(": ", 1)[-1]))
        except RuntimeError as e:
            r.report(False, "llama.cpp refuses %s (%s)" % (os.path.basename(p), e))
    t300 = r.tokens(N_POS_F32, "tokens300.bin")
    a = r.logits("lcpp", f32, t300, r.path("f32.lcpp"), N_POS_F32)
    b = r.logits("dsi", f32, t300, r.path("f32.dsi"), N_POS_F32)
    mx, mean, top1 = r.stats(a, b)
    r.report(top1 >= 0.99 and mx <= TOL_SAME_FILE,
             "f32, llama.cpp layout, %d positions: top-1 %.1f %%, max |d| %.2e, mean |d| %.2e (need top-1 >= 99 %%, max <= %.0e)"
             % (N_POS_F32, 100 * top1, mx, mean, TOL_SAME_FILE))

    # ---- 2. llama.cpp's quantizer, every type ------------------------------------------------
    tt = r.tokens(N_POS_TYPE, "tokens200.bin")
    r.lines.append("type | 2a dsi(q) vs dsi(ggml-deq) max|d| | 2b lcpp vs dsi on deq: max|d| top-1 | "
                   "2c lcpp vs dsi on q: top-1 max|d| mean|d| | lcpp(q) vs lcpp(deq): top-1 mean|d|")
    # Checks 2 and 5, one job per type on DSI_JOBS worker threads (default: the CPUs; every
    # program they run uses one thread), reported in the serial order.
    jobs = int(os.environ.get("DSI_JOBS") or os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        two = [pool.submit(check_lcpp_quantized, r, tt, f32, name, ftype, pure, want_type, lo, hi)
               for name, ftype, pure, want_type, (lo, hi) in selected()]
        five = [pool.submit(check_dsi_quantized, r, tt, f32, name, want_type, lo, hi)
                for name, _ftype, _pure, want_type, (lo, hi) in selected() if name not in MIXES]
        for f in two:
            r.replay(f.result())
        r.lines.append("type | 5a dsi(ours) vs dsi(ggml-deq of ours) max|d| | 5b lcpp vs dsi on ours: top-1 max|d| mean|d|")
        for f in five:
            r.replay(f.result())

    # ---- 3. MTP in llama.cpp's layout binds to the native file's tensors ---------------------
    nat = r.path("tiny-v4-lcpp-native.gguf")
    r.sh(r.mk, "--config", "tiny-v4-lcpp", "--type", "f32", "--layout", "native", "-o", nat)
    try:
        out = r.sh(r.cmp, nat, f32, "--draft", mtp).strip()
        r.report(out.startswith("identical"), "MTP in llama.cpp's second file vs the native file: " + out.split(" between")[0])
    except RuntimeError as e:
        r.report(False, "MTP in llama.cpp's layout: %s" % e)

    # ---- 4. speed, both engines, same file, same run ------------------------------------------
    bench = r.path("tiny-v4-lcpp-q8_0.gguf")
    if os.path.exists(bench):
        try:
            lc = r.sh(r.peer, "bench", bench, "128", "32", "1").strip()
            ds = r.sh(r.dsi, "--bench", bench, "128", "32", "--threads", "1").strip()

            def tps(s):
                p = s.replace(";", "").split()
                return float(p[5]), float(p[12])
            (lp, lg), (dp, dg) = tps(lc), tps(ds)
            r.report(True, "speed (q8_0 tiny-v4-lcpp, 1 thread each, prefill 128 / decode 32): libdsinfer %.0f / %.1f tok/s, "
                     "llama.cpp %.0f / %.1f tok/s, ratio libdsinfer/llama.cpp prefill %.2f, decode %.2f"
                     % (dp, dg, lp, lg, dp / lp, dg / lg))
        except (RuntimeError, ValueError, IndexError) as e:
            r.report(False, "speed: %s" % e)

    with open(r.path("interop-results.txt"), "w") as f:
        f.write("\n".join(r.lines) + "\n")
    print("%d checks failed" % r.failed if r.failed else "all interop checks passed")
    return 1 if r.failed else 0


if __name__ == "__main__":
    sys.exit(main())
