#!/usr/bin/env bash
# The GPU check, in minutes on one CUDA machine: the GPU tests (FlexAttention paths against the native ones,
# half precision for every type) and the GPU benchmark (benchmarks/gpu.py: every type against exact sdpa,
# forward + backward in bfloat16, n = 4k..64k; JSON, markdown and plots).
#
#   benchmarks/gpu_check.sh [OUT_DIR]            # on a CUDA machine (default OUT_DIR: benchmarks/results/gpu)
#   benchmarks/gpu_check.sh --dry-run [OUT_DIR]  # on a CPU: the same code at tiny sizes (CI runs this)
#
# The benchmark runs four times: every type's non-causal form (core), the causal forms beside
# flash-linear-attention's kernels (causal, into OUT_DIR/causal), a whole training step of the text model
# (model_step, into OUT_DIR/model_step) and per-token decoding against the context (generation, into
# OUT_DIR/generation); then the GPU tests (tests). GPU_CHECK_PARTS picks parts on a GPU.
#
# Needs: python3 with torch (>= 2.5, FlexAttention), transformers (the version pyproject.toml asks for),
# accelerate, safetensors, tokenizers, scipy, Pillow, matplotlib and pytest; the GPU images of this project's
# device machines have them (an older transformers there: put the wheel of ours first on PYTHONPATH).
# hf_efficient runs from this checkout (PYTHONPATH), so nothing is installed and no network is needed. The
# causal benchmark's peers need flash-linear-attention's kernels (fla-core, pure Python over Triton) and
# einops: where the machine reaches no package index, put their wheels in build/gpu_wheels beforehand
# (pip download --no-deps -d build/gpu_wheels fla-core einops, plus transformers and its hub, tokenizers and
# safetensors wheels where the machine's transformers is older than ours) and carry that folder: they are
# unpacked into build/gpu_site, which goes first on PYTHONPATH. Each step has its own time limit, the benchmarks first (they write results.json after every
# point), so a stuck step cannot take the whole budget and the check ends within 10 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
if [ "${1:-}" = "--dry-run" ]; then DRY_RUN=1; shift; fi
OUT=${1:-benchmarks/results/gpu}
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}  # the project venv where there is one
mkdir -p "$OUT"
if ls build/gpu_wheels/*.whl >/dev/null 2>&1; then  # carried wheels: unpacked afresh (they may have changed)
  rm -rf build/gpu_site
  for wheel in build/gpu_wheels/*.whl; do "$PY" -m zipfile -e "$wheel" build/gpu_site; done
fi
SITE=$([ -d build/gpu_site ] && echo "$PWD/build/gpu_site:" || true)
export PYTHONPATH="$SITE$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1

GPU_TESTS=$(grep -rl "pytest.mark.gpu" tests --include='*.py' | sort)
PARTS=" ${GPU_CHECK_PARTS:-core causal model_step generation tests} "  # on a GPU: which parts run (all by default)
part() { [[ "$PARTS" == *" $1 "* ]]; }
status=0
{
  echo "date: $(date -u +%FT%TZ)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__, 'gpu', torch.cuda.get_device_name() if torch.cuda.is_available() else None)"
} | tee "$OUT/environment.txt"

if [ "$DRY_RUN" = 1 ]; then
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  # the four parts in one process (one start-up and one import of torch and transformers, not four)
  timeout 600 "$PY" -m benchmarks.gpu --dry-run --every_kind --out "$OUT" || status=1
  # on a CPU the gpu-marked tests skip: this checks that they collect (the test suite runs their files' CPU
  # tests, which cover the same FlexAttention / precision code)
  timeout 300 "$PY" -m pytest -q -p no:cacheprovider -m gpu $GPU_TESTS || status=1
else
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU: use --dry-run')" || exit 1
  # time limits from the H100 run of 2026-11-28: the non-causal sweep took ~100 s; the causal one spent 100 s
  # at its first length (fla's Triton kernels compile and autotune on first use), so it runs the two lengths
  # the issue's goals name (16k against fla, 64k); the GPU tests need more than 180 s
  # the parts take up to 14 minutes together (each has its own limit): on a machine lent in calls of 10
  # minutes, run two calls into the same OUT_DIR (GPU_CHECK_PARTS="core causal model_step", then
  # GPU_CHECK_PARTS="generation tests")
  if part core; then timeout 150 "$PY" -m benchmarks.gpu --out "$OUT" --budget_s 110 || status=1; fi
  if part causal; then
    timeout 220 "$PY" -m benchmarks.gpu --causal --lengths 16384 65536 --out "$OUT/causal" --budget_s 170 \
      || status=1
  fi
  if part model_step; then
    timeout 150 "$PY" -m benchmarks.gpu --model_step --out "$OUT/model_step" --budget_s 110 || status=1
  fi
  if part generation; then
    timeout 120 "$PY" -m benchmarks.gpu --generation --out "$OUT/generation" --budget_s 80 || status=1
  fi
  if part tests; then
    timeout 200 "$PY" -m pytest -q -p no:cacheprovider -m gpu --junitxml="$OUT/gpu_tests.xml" $GPU_TESTS \
      2>&1 | tee "$OUT/gpu_tests.txt" || status=1
  fi
fi
echo "gpu_check: $([ $status = 0 ] && echo passed || echo FAILED); results in $OUT"
exit $status
