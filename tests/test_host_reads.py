"""How often a decoding step reads tensors back to the host. On CUDA each read waits for the
device (a host sync: scripts/count_host_syncs.py counts them there); on the CPU the same calls
are counted here, so a new read in the step shows up on every machine. A step reads once: the
verify outcome (greedy and seeded requests: the target's picks, chains and trees alike, compared
with the drafts on the host; sampled ones: accepted counts and next tokens in one transfer). The
check that the target's logits are finite is not a read of its own: its flags are copied to the
host behind the forward, whose end the step waits for anyway to time it
(:class:`specdec.host_copy.HostCopy`, which reads host memory, not counted here)."""

from __future__ import annotations

import collections

import pytest
import torch

from specdec import LLM, SamplingParams
from specdec.testing.recording import emulate_cuda_graphs

#: The tensor methods that copy to the host.
READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            counts[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return counts


@pytest.mark.parametrize(("config", "temperature"), [
    (None, 0.0),
    ({"method": "ngram", "num_speculative_tokens": 3}, 0.0),
    ({"method": "ngram", "num_speculative_tokens": 3}, 1.0),
    ({"method": "suffix", "num_speculative_tokens": 4}, 0.0),  # tree drafts
], ids=["plain", "chains", "sampled chains", "trees"])
@pytest.mark.parametrize("execution", ["auto", "cuda_graph"])
def test_a_step_reads_the_device_once(tiny, config, temperature, execution, reads, monkeypatch) -> None:
    """On the device's default path and on captured forwards (CUDA graphs on CUDA, emulated
    elsewhere), the default on CUDA."""
    emulate_cuda_graphs(monkeypatch)
    prompt = {"prompt_token_ids": tiny.encode("hello world, hello world, hello")}
    counted = {}
    with LLM(tiny.model, config, tokenizer=tiny.tokenizer, execution=execution, max_model_len=256) as llm:
        llm.generate(prompt, SamplingParams(max_tokens=4, ignore_eos=True))
        for max_tokens in (8, 40):
            reads.clear()
            params = SamplingParams(max_tokens=max_tokens, temperature=temperature, ignore_eos=True, seed=1)
            output = llm.generate(prompt, params)[0]
            counted[max_tokens] = (sum(reads.values()), output.metrics.num_steps)
    # The difference of two runs leaves out what a request reads once (its prompt's first token).
    (short_reads, short_steps), (long_reads, long_steps) = counted[8], counted[40]
    assert long_steps > short_steps
    per_step = (long_reads - short_reads) / (long_steps - short_steps)
    assert per_step == 1, counted
