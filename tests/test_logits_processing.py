"""Logits processors: each verify row is processed exactly as transformers' own processors (or
the definition, where transformers has none) process the sequence that row follows; drafts a
processor forbids are cut; a grammar's masks are llguidance's own; bad input is a clear error."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from pydantic import ValidationError
from transformers import (MinNewTokensLengthLogitsProcessor, NoBadWordsLogitsProcessor, RepetitionPenaltyLogitsProcessor,
                          SequenceBiasLogitsProcessor)

from specdec import (LLM, ConfigError, DraftProposal, PluginError, Request, RequestFailedError, SamplingParams, SpecdecError,
                     StructuredOutputsParams)
from specdec.logits_processing import (BadWords, GrammarCompiler, LogitBias, MinTokens, Penalties, RequestProcessors,
                                       VerifyRows)
from specdec.logits_processing.token_rules import bad_word_sequences

VOCAB = 36
PROMPT = [5, 6, 7, 8]
OUTPUT = [9, 5, 9, 10, 3]
#: A tree: nodes 0 and 3 hang off the committed tokens, 1 and 2 under 0, 4 under 1.
TREE = DraftProposal([9, 11, 5, 12, 9], parents=[-1, 0, 0, -1, 1])
CHAIN = DraftProposal([9, 11, 2, 5])


def request(output: list[int] = OUTPUT, **params) -> Request:
    return Request(0, PROMPT + output, len(PROMPT), SamplingParams(**params))


def row_sequences(req: Request, proposal: DraftProposal) -> list[list[int]]:
    """The whole sequence each verify row follows, written out."""
    return [req.token_ids + list(path) for path in VerifyRows.of(req, proposal).paths]


def reference_rows(req: Request, proposal: DraftProposal, logits: torch.Tensor, process) -> torch.Tensor:
    """``process(sequence, row_logits)`` applied to each row on its own."""
    return torch.stack([process(seq, logits[row : row + 1].clone())[0] for row, seq in enumerate(row_sequences(req, proposal))])


@pytest.mark.parametrize("proposal", [CHAIN, TREE], ids=["chain", "tree"])
def test_verify_rows_follow_the_paths_of_chain_and_tree(proposal: DraftProposal) -> None:
    rows = VerifyRows.of(request(), proposal)
    if proposal.parents is None:
        assert rows.paths == [(), (9,), (9, 11), (9, 11, 2), (9, 11, 2, 5)]
    else:
        assert rows.paths == [(), (9,), (9, 11), (9, 5), (12,), (9, 11, 9)]
        assert [rows.row_parent(r) for r in range(1, 6)] == [0, 1, 1, 0, 2]


@pytest.mark.parametrize("proposal", [CHAIN, TREE], ids=["chain", "tree"])
def test_penalties_equal_transformers_repetition_and_the_definition_of_frequency_and_presence(proposal) -> None:
    req = request()
    logits = torch.randn(len(proposal) + 1, VOCAB, generator=torch.Generator().manual_seed(0)) * 3
    penalties = Penalties(PROMPT, VOCAB, torch.device("cpu"), repetition=1.3, frequency=0.4, presence=0.25)
    penalties.accept(OUTPUT)
    got = penalties.apply(logits.clone(), VerifyRows.of(req, proposal))

    def reference(seq: list[int], row: torch.Tensor) -> torch.Tensor:
        row = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([seq]), row)
        for token, count in Counter(seq[len(PROMPT):]).items():  # vLLM counts the output only
            row[0, token] -= 0.4 * count + 0.25
        return row

    torch.testing.assert_close(got, reference_rows(req, proposal, logits, reference), rtol=0, atol=1e-6)


def test_logit_bias_equals_transformers_sequence_bias() -> None:
    bias = {3: 2.5, 17: -100.0}
    logits = torch.randn(len(TREE) + 1, VOCAB)
    got = LogitBias(bias, VOCAB, torch.device("cpu")).apply(logits.clone(), VerifyRows.of(request(), TREE))
    expected = SequenceBiasLogitsProcessor([[[t], b] for t, b in bias.items()])(torch.tensor([[1]] * len(logits)), logits.clone())
    assert torch.equal(got, expected)


@pytest.mark.parametrize("proposal", [CHAIN, TREE], ids=["chain", "tree"])
def test_min_tokens_equals_transformers_min_new_tokens(proposal: DraftProposal) -> None:
    req = request(min_tokens=7)
    logits = torch.randn(len(proposal) + 1, VOCAB)
    got = MinTokens(7, [2, 30]).apply(logits.clone(), VerifyRows.of(req, proposal))
    processor = MinNewTokensLengthLogitsProcessor(len(PROMPT), 7, [2, 30])
    assert torch.equal(got, reference_rows(req, proposal, logits, lambda seq, row: processor(torch.tensor([seq]), row)))


def test_min_tokens_cuts_a_stop_token_drafted_too_early() -> None:
    # 5 tokens are out: the chain's EOS (node 2) would come after 7.
    assert MinTokens(8, [2]).usable_drafts(VerifyRows.of(request(), CHAIN)) == 2
    assert MinTokens(7, [2]).usable_drafts(VerifyRows.of(request(), CHAIN)) == 4


@pytest.mark.parametrize("proposal", [CHAIN, TREE], ids=["chain", "tree"])
def test_bad_words_equal_transformers_no_bad_words_over_the_output(proposal: DraftProposal) -> None:
    sequences = [(11,), (9, 11), (10, 3, 9), (5, 9, 5)]
    req = request()
    logits = torch.randn(len(proposal) + 1, VOCAB)
    got = BadWords(sequences).apply(logits.clone(), VerifyRows.of(req, proposal))
    processor = NoBadWordsLogitsProcessor([list(s) for s in sequences])
    expected = reference_rows(req, proposal, logits, lambda seq, row: processor(torch.tensor([seq[len(PROMPT):]]), row))
    assert torch.equal(got, expected)
    assert got.isinf().any(), "no bad word applied: the test would prove nothing"


def test_bad_words_cut_the_draft_that_completes_one(tiny) -> None:
    sequences = bad_word_sequences(tiny.tokenizer, ["cat"])
    assert (5, 3, 22) in sequences
    req = Request(0, tiny.encode("the c"), 2, SamplingParams())
    assert BadWords(sequences).usable_drafts(VerifyRows.of(req, DraftProposal(tiny.encode("at a cat")))) == 1


# -- grammar -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def grammars(tiny) -> GrammarCompiler:
    return GrammarCompiler(tiny.tokenizer, len(tiny.tokenizer), [2])


WORDS = StructuredOutputsParams(regex="(the|a) (cat|mat) (sat|ran)\\.")


def allowed(matcher) -> set[int]:
    return {i for i, b in enumerate(bytes(matcher.compute_logit_bias())) if b}


def test_grammar_masks_each_row_with_the_state_after_its_own_prefix(tiny, grammars) -> None:
    grammar = grammars.processor(WORDS)
    prefix = tiny.encode("the c")
    grammar.accept(prefix)
    req = Request(0, [1, *prefix], 1, SamplingParams())
    drafts = DraftProposal(tiny.encode("at s") + tiny.encode("m"), parents=[-1, 0, 1, 2, 1])
    logits = torch.zeros(len(drafts) + 1, len(tiny.tokenizer))
    got = grammar.apply(logits.clone(), VerifyRows.of(req, drafts))
    for row, path in enumerate(VerifyRows.of(req, drafts).paths):
        fresh = grammars.matcher(WORDS)
        if not fresh.consume_tokens(prefix + list(path)):  # "at m": unreachable, left as it is
            assert torch.equal(got[row], logits[row])
            continue
        assert {int(t) for t in torch.nonzero(got[row] == 0)} == allowed(fresh), f"row {row}"
    assert grammar.usable_drafts(VerifyRows.of(req, drafts)) == 4
    assert allowed(grammar.matcher) == set(tiny.encode("a")), "the matcher did not come back to the committed tokens"


def test_grammar_cuts_chain_at_the_first_forbidden_draft_and_allows_eos_when_complete(tiny, grammars) -> None:
    grammar = grammars.processor(WORDS)
    req = Request(0, [1], 1, SamplingParams())
    good = tiny.encode("a cat ran.")
    assert grammar.usable_drafts(VerifyRows.of(req, DraftProposal(good + [2]))) == len(good) + 1
    assert grammar.usable_drafts(VerifyRows.of(req, DraftProposal(tiny.encode("a cot")))) == 3
    assert grammar.usable_drafts(VerifyRows.of(req, DraftProposal(tiny.encode("a ca") + [2]))) == 4


def test_each_constraint_is_compiled_once(tiny) -> None:
    compiler = GrammarCompiler(tiny.tokenizer, len(tiny.tokenizer), [2])
    for _ in range(3):
        compiler.matcher(WORDS)
        compiler.matcher(StructuredOutputsParams(choice=["yes", "no"]))
    assert compiler.compilations == 2


@pytest.mark.parametrize(("spec", "field"), [
    (dict(regex="a(b"), "structured_outputs.regex"),
    (dict(json={"type": "frobnicate"}), "structured_outputs.json"),
    (dict(json="{not json"), "structured_outputs.json"),
    (dict(grammar="start: missing_rule"), "structured_outputs.grammar"),
])
def test_a_malformed_constraint_is_a_config_error_naming_it(grammars, spec, field) -> None:
    with pytest.raises(ConfigError, match=f"^{field}: "):
        grammars.matcher(StructuredOutputsParams(**spec))


@pytest.mark.parametrize("spec", [dict(), dict(regex="a", choice=["a"]), dict(json_object=False)])
def test_structured_outputs_takes_exactly_one_constraint(spec) -> None:
    with pytest.raises(ValidationError, match="set exactly one of json, regex, choice, grammar, json_object"):
        StructuredOutputsParams(**spec)


def test_a_token_against_the_grammar_is_an_error(tiny, grammars) -> None:
    grammar = grammars.processor(WORDS)
    with pytest.raises(SpecdecError, match="does not follow the grammar"):
        grammar.accept(tiny.encode("x"))


# -- in the engine ------------------------------------------------------------------------------------


def test_processors_run_in_vllms_order() -> None:
    """Bias before penalties: a repetition penalty divides the biased logit."""
    processors = RequestProcessors([LogitBias({3: 1.0}, VOCAB, torch.device("cpu")),
                                    Penalties(PROMPT + [3], VOCAB, torch.device("cpu"), repetition=2.0)])
    logits = torch.zeros(1, VOCAB)
    assert processors.apply(logits, VerifyRows.of(request()))[0, 3] == 0.5
    assert logits[0, 3] == 0, "the target's logits were changed in place"


def test_bad_input_names_the_field(tiny) -> None:
    llm = LLM(tiny.model, None, tokenizer=tiny.tokenizer)
    with pytest.raises(ConfigError, match="^logit_bias: token id 99 is outside the vocabulary"):
        llm.generate({"prompt_token_ids": [1, 5]}, SamplingParams(logit_bias={99: 1.0}))
    with pytest.raises(ValidationError, match="min_tokens"):
        SamplingParams(min_tokens=9, max_tokens=4)
    with pytest.raises(ValidationError, match="repetition_penalty"):
        SamplingParams(repetition_penalty=0)


def test_a_grammar_cut_short_by_max_tokens_ends_with_length_and_a_valid_prefix(tiny, grammars) -> None:
    llm = LLM(tiny.model, {"method": "ngram", "max_draft_len": 4}, tokenizer=tiny.tokenizer)
    spec = StructuredOutputsParams(regex="([a-z]+ ){20}end\\.")
    out = llm.generate({"prompt_token_ids": tiny.encode("abc abd abe ab")}, SamplingParams(max_tokens=12, structured_outputs=spec))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 12
    assert grammars.matcher(spec).consume_tokens(out.token_ids)


def test_constrained_output_matches_its_grammar_under_speculation(tiny) -> None:
    import re

    llm = LLM(tiny.model, {"method": "ngram", "max_draft_len": 4}, tokenizer=tiny.tokenizer)
    spec = StructuredOutputsParams(choice=["the cat sat on the mat", "a cat ran"])
    prompt = tiny.encode("the cat sat on the mat. the cat sat on the mat. ")
    outputs = llm.generate([{"prompt_token_ids": prompt}] * 4,
                           [SamplingParams(max_tokens=30, structured_outputs=spec)] +
                           [SamplingParams(max_tokens=30, temperature=1.0, seed=s, structured_outputs=spec) for s in range(3)])
    for out in outputs:
        assert out.text in spec.choice and out.finish_reason == "stop"
    assert re.fullmatch("the cat sat on the mat", outputs[0].text)
    assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0


def test_a_plugin_adds_its_own_processor_for_any_method(installed_plugins, tiny) -> None:
    """The installed example plugin bans a token through ``extra_args``, whatever method runs;
    its hook failing is a PluginError naming it; its processor failing ends only its request."""
    prompt = {"prompt_token_ids": tiny.encode("the cat sat on the mat. the cat")}
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer)
    free = plain.generate(prompt, SamplingParams(max_tokens=30))[0]
    e = free.token_ids[0]
    banned = plain.generate(prompt, SamplingParams(max_tokens=30, extra_args={"echo_ban": e}))[0]
    assert e in free.token_ids and e not in banned.token_ids
    spec = LLM(tiny.model, {"method": "ngram", "max_draft_len": 4}, tokenizer=tiny.tokenizer, max_batch_size=2)
    assert spec.generate(prompt, SamplingParams(max_tokens=30, extra_args={"echo_ban": e}))[0].token_ids == banned.token_ids
    with pytest.raises(PluginError, match="echo.*specdec_logits_processors: RuntimeError: echo: this hook always fails"):
        spec.generate(prompt, SamplingParams(extra_args={"echo_ban_fails": "hook"}))
    with pytest.raises(RequestFailedError) as failed:
        spec.generate([prompt, prompt], [SamplingParams(max_tokens=30, extra_args={"echo_ban": e, "echo_ban_fails": "apply"}),
                                         SamplingParams(max_tokens=30)])
    failing, fine = failed.value.outputs
    assert failing.finish_reason == "error"
    assert failing.error == "logits processing failed: RuntimeError: echo: this processor always fails"
    assert fine.token_ids == free.token_ids
