"""EAGLE-3 tests run tiny models only."""

import torch

# As in the core's tests/conftest.py: one intra-op thread is as fast as two for tiny models on an
# idle machine, and avoids OpenMP spin-waiting that slows them many times over on a shared one.
torch.set_num_threads(1)
