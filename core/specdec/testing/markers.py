"""pytest markers for tests that need something the machine may lack."""

import pytest

from specdec.prepacked_linear import prepack_status

_packing, _why_not = prepack_status()

#: Skips a test of packed bf16 linear layers (:func:`specdec.prepack_linears`) where PyTorch cannot pack them.
needs_prepacked_linears = pytest.mark.skipif(not _packing, reason=f"no packed bf16 linears here: {_why_not}")
