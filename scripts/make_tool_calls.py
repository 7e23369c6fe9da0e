"""Write the bundled ``tool_calls`` prompt set (core/specdec/data/tool_calls/question.jsonl).

Requests as an agent framework sends them: a user question and four function tools in OpenAI's
format, with ``tool_choice`` ``required`` (the model picks among the tools) or naming the function
that answers it. ``specdec bench --dataset tool_calls`` offers the tools in the prompt and
constrains the reply as the choice asks, for plain and speculative decoding alike.
"""

from __future__ import annotations

import json
from pathlib import Path


def function(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


TOOLS = [
    function("get_weather", "Current weather in a city.",
             {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}, ["city", "unit"]),
    function("get_time", "Current local time in an IANA time zone.", {"timezone": {"type": "string"}}, ["timezone"]),
    function("convert_currency", "Convert an amount between currencies.",
             {"amount": {"type": "number"}, "from": {"type": "string"}, "to": {"type": "string"}}, ["amount", "from", "to"]),
    function("search_web", "Search the web.", {"query": {"type": "string"}, "max_results": {"type": "integer"}},
             ["query", "max_results"]),
]
REQUESTS = [
    ("What's the weather like in Lisbon right now, in celsius?", "get_weather"),
    ("Is it cold in Chicago today? Give me fahrenheit.", "get_weather"),
    ("What time is it in Tokyo?", "get_time"),
    ("I have a call with someone in Berlin. What is their local time?", "get_time"),
    ("How much is 250 US dollars in euros?", "convert_currency"),
    ("Convert 1200 Japanese yen to British pounds, please.", "convert_currency"),
    ("Find me three recent articles about speculative decoding.", "search_web"),
    ("Search for the best hiking trails near Zurich, five results.", "search_web"),
]


def main() -> None:
    out = Path(__file__).resolve().parent.parent / "core/specdec/data/tool_calls/question.jsonl"
    rows = []
    for n, (ask, name) in enumerate(REQUESTS):
        rows.append({"question_id": f"required/{n}", "category": "required", "turns": [ask], "tools": TOOLS,
                     "tool_choice": "required"})
        rows.append({"question_id": f"named/{n}", "category": "named", "turns": [ask], "tools": TOOLS,
                     "tool_choice": {"type": "function", "function": {"name": name}}})
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} prompts to {out}")


if __name__ == "__main__":
    main()
