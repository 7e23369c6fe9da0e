#!/usr/bin/env bash
# Download the wheels a GPU machine without a package index needs to run specdec and its tests
# (see docs/testing.md): what specdec, its test and serve extras need and that machine's image
# lacks, for CPython 3.12 on x86-64 Linux, at the versions installed in .venv here.
# scripts/gpu_check.sh installs every wheel it finds in the folder.
# Usage: bash scripts/gpu_wheels.sh [DIR]   (default .gpu/wheels: git ignores .gpu/; carry it to the machine)
set -euo pipefail
cd "$(dirname "$0")/.."

DIR="${1:-.gpu/wheels}"
PYTHON_VERSION="${GPU_PYTHON_VERSION:-3.12}"
# Missing from the image's package list (pydantic and its parts; the fastapi, uvicorn and openai
# and anthropic stacks of `specdec serve` and its tests; llguidance for structured outputs). typing-extensions comes along in the version
# pydantic-core was installed with here, which an older one on the machine may not satisfy.
PACKAGES=(pydantic pydantic-core annotated-types typing-inspection typing-extensions
          fastapi starlette opentelemetry-api uvicorn openai anthropic docstring-parser jiter sniffio httpx2 httpcore2 truststore
          llguidance)

pins=()
for name in "${PACKAGES[@]}"; do
  pins+=("$name==$(.venv/bin/python -c 'import importlib.metadata, sys; print(importlib.metadata.version(sys.argv[1]))' "$name")")
done
platforms=()
for tag in manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
  platforms+=(--platform "${tag}_x86_64")
done
# pip's own exit status counts; only its noise about local index paths is filtered out (as in setup.sh).
.venv/bin/python -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: \
  --python-version "$PYTHON_VERSION" --implementation cp "${platforms[@]}" -d "$DIR" "${pins[@]}" \
  2> >(grep -v "^WARNING: Location" >&2)
echo "wheels for CPython $PYTHON_VERSION in $DIR: ${pins[*]}"
