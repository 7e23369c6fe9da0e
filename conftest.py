"""Settings for every test in the repository: the core's tests/ and each plugin's tests/."""

import torch

# The test models are tiny: one intra-op thread is as fast as two when the machine is idle, and
# avoids OpenMP spin-waiting that slows them many times over when other processes share the CPUs.
# Tests on the real model restore all cores for themselves.
torch.set_num_threads(1)
