"""How far a match drafts by default: past its own length by ``suffix_decoding_max_spec_offset``."""

from __future__ import annotations

import pytest

from specdec import Request, SamplingParams
from specdec_suffix import SuffixDecodingConfig
from specdec_suffix.plugin import SuffixResources

#: A prompt whose text the reply copies after an edit: "x y" occurs once, followed by 1 ... 8.
PROMPT = [20, 21, 1, 2, 3, 4, 5, 6, 7, 8, 30, 31]


@pytest.mark.parametrize(("offset", "expected"), [(None, [1, 2, 3, 4, 5, 6]), (0.0, [1, 2])])
def test_a_fresh_match_drafts_past_its_length(offset: float | None, expected: list[int]) -> None:
    """A reply that returns to its prompt's text (here "... 99 20 21": a 2-token match) drafts
    2 + 4 tokens by default, where vLLM's rule (``max_spec_offset`` 0) drafts 2."""
    options = {} if offset is None else {"suffix_decoding_max_spec_offset": offset}
    config = SuffixDecodingConfig(suffix_decoding_tree_spec=False, suffix_decoding_max_cached_requests=0, **options)
    resources = SuffixResources(config)
    request = Request(0, [*PROMPT, 99, 20, 21], len(PROMPT), SamplingParams(), max_draft_len=24)
    resources.add_request(request)
    assert resources.propose(request).token_ids == expected
