"""`specdec bench --baseline hf` has a peer for suffix decoding: transformers' prompt lookup, at
its documented draft length or this config's, whichever is shorter, and greedy it gives plain
generate's tokens."""

from __future__ import annotations

import torch
from specdec_suffix import SuffixDecodingConfig

from specdec.testing import hf_peer_kwargs


def test_the_peer_is_prompt_lookup(tiny) -> None:
    assert hf_peer_kwargs(tiny, SuffixDecodingConfig()) == {"prompt_lookup_num_tokens": 10}
    kwargs = hf_peer_kwargs(tiny, SuffixDecodingConfig(num_speculative_tokens=4))
    assert kwargs == {"prompt_lookup_num_tokens": 4}
    ids = torch.tensor([tiny.encode("the cat sat on the mat. the cat")], device=tiny.model.device)
    plain = tiny.model.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(tiny.model.generate(ids, max_new_tokens=12, do_sample=False, **kwargs), plain)
