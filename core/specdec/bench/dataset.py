"""Spec-Bench-format prompt sets: jsonl rows with ``question_id``, ``category`` and ``turns``, and
optionally ``structured_outputs`` (vLLM's field: the constraint every turn's answer follows) or
``tools`` and ``tool_choice`` (OpenAI's: the tools offered and the call asked for)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from specdec.errors import ConfigError
from specdec.sampling import SamplingParams
from specdec.structured_outputs import StructuredOutputsParams
from specdec.tools import ToolUse, tool_use

if TYPE_CHECKING:
    from specdec.llm import LLM

#: Prompt sets shipped with specdec (evaluation only: never train on them).
BUNDLED = {"spec_bench": "spec_bench/question.jsonl", "humaneval": "humaneval/question.jsonl",
           "code_edits": "code_edits/question.jsonl", "json_extraction": "json_extraction/question.jsonl",
           "tool_calls": "tool_calls/question.jsonl"}

#: The repeated-request set, built from ``spec_bench``: the first prompt of each MT-Bench category
#: sent once (category ``first``), then the same eight prompts again (``repeat``), as retries,
#: n-sampling and agent loops send a task again. Only its first turns are sent.
REPEATED = "repeated"

#: Names for groups of Spec-Bench's categories: its multi-turn conversation part is MT-Bench's
#: eight categories, 10 prompts each.
CATEGORY_GROUPS = {
    "mt_bench": ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"),
}


@dataclass
class Question:
    question_id: str
    category: str
    turns: list[str]
    structured_outputs: StructuredOutputsParams | None = None
    tools: ToolUse | None = None

    def params(self, params: SamplingParams) -> SamplingParams:
        """``params`` with this question's constraint (its own, or its tool call's), if it has one."""
        constraint = self.tools.constraint() if self.tools is not None else None
        constraint = constraint or self.structured_outputs
        if constraint is None:
            return params
        return params.model_copy(update={"structured_outputs": constraint})

    def encode(self, llm: LLM, messages: list[dict[str, Any]]) -> list[int]:
        """The prompt's token ids for a conversation, with this question's tools offered."""
        if self.tools is None:
            return llm.encode(messages, chat=True)
        shown, template_kwargs = self.tools.conversation(messages, llm.chat_template)
        return llm.encode(shown, chat=True, template_kwargs=template_kwargs)


def load_questions(dataset: str, categories: list[str] | None = None, per_category: int | None = None) -> list[Question]:
    """Questions of ``dataset`` (a bundled name, ``repeated`` or a jsonl path), filtered and capped per category."""
    if dataset == REPEATED:
        return _select(_repeated(load_questions("spec_bench", ["mt_bench"], 1)), REPEATED, categories, per_category)
    if dataset in BUNDLED:
        text = resources.files("specdec.data").joinpath(BUNDLED[dataset]).read_text()
    else:
        try:
            text = Path(dataset).read_text()
        except OSError as exc:
            raise ConfigError(f"--dataset: cannot read {dataset!r} ({exc.strerror}); use {', '.join([*BUNDLED, REPEATED])} "
                              "or a jsonl file") from None
        except UnicodeDecodeError:
            raise ConfigError(f"--dataset: {dataset!r} is not UTF-8 text") from None
    source = dataset
    questions = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            turns = row["turns"]
            if not (isinstance(turns, list) and turns and all(isinstance(t, str) and t for t in turns)):
                raise ValueError("`turns` must be a non-empty list of non-empty strings")
            constraint = row.get("structured_outputs")
            constraint = None if constraint is None else StructuredOutputsParams(**constraint)
            tools = tool_use(row["tools"], row.get("tool_choice")) if "tools" in row else None
            questions.append(Question(str(row["question_id"]), str(row.get("category", "default")), turns, constraint, tools))
        except ValidationError as exc:
            raise ConfigError(f"--dataset: {source} line {n}: structured_outputs: {exc.errors()[0]['msg']}") from None
        except ConfigError as exc:  # tools or tool_choice
            raise ConfigError(f"--dataset: {source} line {n}: {exc}") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"--dataset: {source} line {n} is not a Spec-Bench row ({type(exc).__name__}: {exc})") from None
    return _select(questions, source, categories, per_category)


def _repeated(questions: list[Question]) -> list[Question]:
    once = [Question(q.question_id, "first", q.turns[:1]) for q in questions]
    return once + [Question(f"{q.question_id}/again", "repeat", q.turns) for q in once]


def _select(questions: list[Question], source: str, categories: list[str] | None, per_category: int | None) -> list[Question]:
    if categories:
        known = {q.category for q in questions}
        categories = [c for group in categories for c in (CATEGORY_GROUPS.get(group, (group,)) if group not in known else (group,))]
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise ConfigError(f"--categories: unknown {', '.join(unknown)}; {source} has {', '.join(sorted(known))} "
                              f"(and the groups {', '.join(CATEGORY_GROUPS)})")
        questions = [q for q in questions if q.category in categories]
    if per_category:
        counts: dict[str, int] = {}
        kept = []
        for q in questions:
            counts[q.category] = counts.get(q.category, 0) + 1
            if counts[q.category] <= per_category:
                kept.append(q)
        questions = kept
    if not questions:
        raise ConfigError(f"--dataset: no prompts selected from {source}")
    return questions
