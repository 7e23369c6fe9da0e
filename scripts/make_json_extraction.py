"""Write the bundled ``json_extraction`` prompt set (core/specdec/data/json_extraction/question.jsonl).

Structured-output requests as an app sends them: real library functions (CPython's standard
library, PSF license) to describe as JSON against a schema, each row carrying the schema in
``structured_outputs`` (vLLM's field), so ``specdec bench --dataset json_extraction`` decodes under
the grammar. Run with the Python whose library it quotes; the committed file came from CPython 3.11.
"""

from __future__ import annotations

import calendar
import colorsys
import fnmatch
import glob
import html
import inspect
import json
import shlex
import statistics
import string
import textwrap
from pathlib import Path

FUNCTIONS = [textwrap.indent, textwrap.shorten, shlex.quote, string.capwords, statistics.median, colorsys.rgb_to_hsv,
             html.escape, glob.escape, statistics.mode, calendar.leapdays, fnmatch.fnmatch, textwrap.dedent]

SIGNATURE = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "parameters": {"type": "array", "items": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "has_default": {"type": "boolean"}},
            "required": ["name", "has_default"], "additionalProperties": False}},
        "returns": {"type": "string"},
    },
    "required": ["name", "parameters", "returns"],
    "additionalProperties": False,
}
SUMMARY = {
    "type": "object",
    "properties": {
        "summary": {"type": "string"},
        "category": {"enum": ["text", "math", "files", "other"]},
        "raises": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["summary", "category", "raises"],
    "additionalProperties": False,
}
TASKS = {
    "signature": ("Describe the signature of this Python function as JSON: its name, each parameter's name and "
                  "whether it has a default, and what it returns.", SIGNATURE),
    "summary": ("Summarise this Python function as JSON: a one-sentence summary, its category, and the "
                "exceptions it can raise.", SUMMARY),
}


def main() -> None:
    out = Path(__file__).resolve().parent.parent / "core/specdec/data/json_extraction/question.jsonl"
    rows = []
    for category, (ask, schema) in TASKS.items():
        for function in FUNCTIONS:
            source = inspect.getsource(function)
            name = f"{function.__module__}.{function.__name__}"
            rows.append({"question_id": f"{category}/{name}", "category": category,
                         "turns": [f"{ask}\n\n```python\n{source}```"], "structured_outputs": {"json": schema}})
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} prompts to {out}")


if __name__ == "__main__":
    main()
