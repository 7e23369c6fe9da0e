"""Tests of the Triton kernels under the Triton interpreter, on CPU.

``TRITON_INTERPRET=1`` must be set before ``specdec.kernels.triton_kernels`` is imported, so these
tests run in their own pytest process: ``tests/test_kernels.py`` starts it, or run it by hand:

    TRITON_INTERPRET=1 .venv/bin/python -m pytest -q -p no:cacheprovider tests/kernels_interpret

Without that variable (the main test run) this directory is not collected.
"""

import os

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"

collect_ignore_glob = [] if INTERPRETING else ["*.py"]
