"""Write the bundled ``code_edits`` prompt set (core/specdec/data/code_edits/question.jsonl).

Code-edit requests as a user sends them to an assistant: real library functions (CPython's
standard library, PSF license) with an edit to make, whose answer rewrites most of the function.
Replies copy their prompt heavily, which is what copy-based drafters (n-gram, suffix, use_sa_spec)
are for. Run with the Python whose library it quotes; the committed file came from CPython 3.11.
"""

from __future__ import annotations

import calendar
import colorsys
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
             html.escape, glob.escape, statistics.mode, calendar.leapdays]
EDITS = {
    "type_hints": "Add type hints to this Python function. Reply with the whole function.",
    "rename": "Give the local variables and parameters of this Python function longer, descriptive names. "
              "Reply with the whole function.",
    "strip_docs": "Remove the docstring and the comments from this Python function, changing nothing else. "
                  "Reply with the whole function.",
}
OUT = Path(__file__).resolve().parent.parent / "core/specdec/data/code_edits/question.jsonl"


def main() -> None:
    rows = []
    for kind, instruction in EDITS.items():
        for function in FUNCTIONS:
            source = textwrap.dedent(inspect.getsource(function))
            rows.append({"question_id": f"{kind}/{function.__module__}.{function.__name__}", "category": kind,
                         "turns": [f"{instruction}\n\n```python\n{source}```"]})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} prompts to {OUT}")


if __name__ == "__main__":
    main()
