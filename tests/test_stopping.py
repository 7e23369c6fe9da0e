"""Stop conditions: which requests end only at a known length."""

from specdec import SamplingParams
from specdec.requests import Request
from specdec.stopping import StopChecker


def test_only_a_request_that_ignores_eos_and_has_no_stops_has_a_known_remainder():
    """Tokens left are the smaller of the output budget and the model's context; EOS, a stop
    token or a stop string can end a request sooner, so then the remainder is unknown."""
    checker = StopChecker(None, {2}, max_length=40)

    def remaining(**params) -> int | None:
        request = Request(0, [5] * 10 + [6] * 4, 10, SamplingParams(**params))
        return checker.known_remaining(request)

    assert remaining(max_tokens=20, ignore_eos=True) == 16
    assert remaining(max_tokens=100, ignore_eos=True) == 26
    assert remaining(max_tokens=20) is None
    assert remaining(max_tokens=20, ignore_eos=True, stop_token_ids=[7]) is None
    assert remaining(max_tokens=20, ignore_eos=True, stop=["x"]) is None


def test_cut_at_stop_cuts_at_the_first_stop_string_with_or_without_it():
    """The stop string that starts first ends the text (the earlier listed on a tie); with
    ``include`` the text keeps it, and nothing after it."""
    from specdec.stopping import cut_at_stop

    assert cut_at_stop("say hello world", ["world", "lo"]) == "say hel"
    assert cut_at_stop("say hello world", ["world", "lo"], include=True) == "say hello"
    assert cut_at_stop("abcabc", ["bc", "b"], include=True) == "abc"
    assert cut_at_stop("no stop here", ["x"], include=True) == "no stop here"
