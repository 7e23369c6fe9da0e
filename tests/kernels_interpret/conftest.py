"""Tests of the Triton kernels against the torch path: under the Triton interpreter on CPU
tensors, or compiled on CUDA tensors.

``TRITON_INTERPRET=1`` must be set before ``specdec.kernels.triton_kernels`` is imported, so the
interpreted run is a pytest process of its own: ``tests/test_kernels.py`` starts it, or run it by
hand:

    TRITON_INTERPRET=1 .venv/bin/python -m pytest -q -p no:cacheprovider tests/kernels_interpret

With ``SPECDEC_TEST_DEVICE=cuda`` the same tests run the compiled kernels on the GPU, in the main
run too. Otherwise (the main run on the CPU) this directory is not collected.
"""

import os

from specdec.testing import device_under_test

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"

collect_ignore_glob = [] if INTERPRETING or device_under_test().type == "cuda" else ["*.py"]
