#!/usr/bin/env bash
# One command: trains, evaluates and exports a trained model (docs/trained-models.md).
#
#   tools/train/make_model.sh v41|v4 [WORKDIR]
#   tools/train/make_model.sh v41|v4 --drafts-only [WORKDIR]
#
# WORKDIR (default build-train/<arch>) holds the tokenizer, the checkpoint and log.csv; rerun
# the same command after an interruption and training resumes where it stopped. Writes
#   models/kjv-<arch>.gguf                     (through dsinfer-mkmodel --import, Q8_0 matrices)
#   tests/model/data/kjv-<arch>.logprobs        (PyTorch held-out log-probs, for the C test)
#   docs/trained/kjv-<arch>-loss.csv / .png     (loss curves; the PNG needs python3-matplotlib)
#   WORKDIR/drafts.txt                          (draft-block accuracies, eval_drafts.py)
# Needs python3-torch, bible-kjv, a built dsinfer-mkmodel ($DSI_MKMODEL, default
# build/bin/dsinfer-mkmodel). Seeded: the same command gives the same model.
#
# --drafts-only retrains only the draft blocks on the target's own greedy text, the backbone
# frozen and written back byte for byte (docs/trained-models.md "Draft blocks on the target's
# greedy text"): it starts from $DSI_DRAFTS_FROM, by default the model as committed before
# that step (the backbone and the text-trained draft blocks of phase 2, taken from git
# history), generates the greedy corpus with the library (build/libdsinfer.so.0, through
# bindings/python), trains (train_drafts.py), exports, splices the new draft tensors into the
# starting file (splice_drafts.py) and writes models/kjv-<arch>.gguf; WORKDIR defaults to
# build-train/<arch>-drafts. The held-out log-probs are unchanged (same backbone bytes).
set -euo pipefail
usage="usage: make_model.sh v41|v4 [--drafts-only] [WORKDIR]"
arch=${1:?$usage}
shift
drafts_only=0
if [ "${1:-}" = "--drafts-only" ]; then drafts_only=1; shift; fi
root=$(cd "$(dirname "$0")/../.." && pwd)
if [ $drafts_only = 1 ]; then work=${1:-$root/build-train/$arch-drafts}; else work=${1:-$root/build-train/$arch}; fi
mk=${DSI_MKMODEL:-$root/build/bin/dsinfer-mkmodel}
py=/usr/bin/python3
name=kjv-$arch
# The committed models: 240 backbone steps + 80 draft steps, and for kjv-v4 100 more MTP steps
# on the backbone's own greedy text (train.py's phase 3, --greedy-steps): with these the
# command reproduces models/kjv-v4.gguf and the kjv-v41 that --drafts-only starts from byte
# for byte (checked 2026-12-01, docs/trained-models.md "Reproducing the committed models").
# DSI_TRAIN_GREEDY_STEPS=N overrides the phase-3 steps.
case $arch in
  v41) steps=240 dsteps=80 dsteps_text=80 gsteps_default=0 ;;
  v4) steps=240 dsteps=80 dsteps_text=80 gsteps_default=100 ;;
  *) echo "make_model.sh: arch must be v41 or v4" >&2; exit 2 ;;
esac
gsteps=${DSI_TRAIN_GREEDY_STEPS:-$gsteps_default}
[ -x "$mk" ] || { echo "make_model.sh: $mk not found (build first, or set DSI_MKMODEL)" >&2; exit 1; }
# One thread per process: on a shared 2-core machine two OpenMP threads wait on each other
# far longer than they gain (docs/trained-models.md "Speed"). jemalloc, when installed, keeps
# freed memory instead of returning it to the kernel page by page.
export OMP_NUM_THREADS=1
je=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
if [ -e "$je" ]; then
  export LD_PRELOAD=$je MALLOC_CONF="dirty_decay_ms:-1,muzzy_decay_ms:-1"
fi
mkdir -p "$work"
if [ $drafts_only = 1 ]; then
  # the commit whose models carry the phase-2 (text-trained) draft blocks
  from_commit=5685ce21355056b1490b9527c616af746e9f1512
  case $arch in v41|v4) dsteps=${DSI_DRAFT_STEPS:-300} ;; esac
  base=${DSI_DRAFTS_FROM:-$work/start.gguf}
  if [ -z "${DSI_DRAFTS_FROM:-}" ] && [ ! -s "$base" ]; then
    git -C "$root" show "$from_commit:models/$name.gguf" > "$base.tmp" && mv "$base.tmp" "$base"
  fi
  rm -f "$work/ckpt.pt"
  $py "$root/tools/train/ckpt_from_gguf.py" --arch "$arch" --model "$base" \
    --log "$root/docs/trained/$name-loss.csv" --step $((steps + dsteps_text)) --phase 3 --out "$work"
  [ -s "$work/greedy.npz" ] || $py "$root/tools/train/greedy_corpus.py" --model "$base" \
    --lib "${DSI_LIB:-$root/build}" -o "$work/greedy.npz"
  $py "$root/tools/train/train_drafts.py" --arch "$arch" --work "$work" --corpus "$work/greedy.npz" \
    --steps $dsteps | tee "$work/train_drafts.txt"
  $py "$root/tools/train/export.py" --arch "$arch" --work "$work" --mkmodel "$mk" -o "$work/export.gguf"
  $py "$root/tools/train/splice_drafts.py" --base "$base" --new "$work/export.gguf" -o "$root/models/$name.gguf"
  $py "$root/tools/train/eval_drafts.py" --model "$root/models/$name.gguf" \
    --expected "$root/tests/model/data/$name.logprobs" | tee "$work/drafts.txt"
  cp "$work/log.csv" "$root/docs/trained/$name-loss.csv"
  if $py -c "import matplotlib" 2>/dev/null; then
    $py "$root/tools/train/plot.py" "$work/log.csv" -o "$root/docs/trained/$name-loss.png" --title "$name"
  fi
  exit 0
fi
$py "$root/tools/train/train.py" --arch "$arch" --out "$work" --steps $steps --draft-steps $dsteps \
  --greedy-steps $gsteps
$py "$root/tools/train/export.py" --arch "$arch" --work "$work" --mkmodel "$mk" -o "$root/models/$name.gguf"
$py "$root/tools/train/expected_logprobs.py" --model "$root/models/$name.gguf" \
  -o "$root/tests/model/data/$name.logprobs" | tee "$work/heldout.txt"
$py "$root/tools/train/eval_drafts.py" --model "$root/models/$name.gguf" \
  --expected "$root/tests/model/data/$name.logprobs" | tee "$work/drafts.txt"
mkdir -p "$root/docs/trained"
cp "$work/log.csv" "$root/docs/trained/$name-loss.csv"
if $py -c "import matplotlib" 2>/dev/null; then
  $py "$root/tools/train/plot.py" "$work/log.csv" -o "$root/docs/trained/$name-loss.png" --title "$name"
else
  echo "make_model.sh: python3-matplotlib not installed; no PNG" >&2
fi
