"""What a request's output must match: a JSON schema, any JSON object, a regex, a choice or a
grammar (vLLM's ``StructuredOutputsParams``; TensorRT-LLM calls it ``GuidedDecodingParams``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: The fields that name a constraint (their written names); exactly one is set.
CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object")


def _value(params: StructuredOutputsParams, name: str) -> Any:
    return params.json_schema if name == "json" else getattr(params, name)


class StructuredOutputsParams(BaseModel):
    """Constrain the output to one of these (set exactly one).

    ``grammar`` is a Lark grammar (llguidance's dialect) or a GBNF one (llama.cpp's); the output
    must match it whole. ``whitespace_flexible`` lets JSON output put any whitespace between
    tokens (vLLM's default); off, it is compact.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    #: Written ``json`` (vLLM's name; pydantic keeps ``json`` for itself).
    json_schema: dict[str, Any] | str | None = Field(default=None, alias="json", description="A JSON schema (object or its text).")
    regex: str | None = None
    choice: list[str] | None = Field(default=None, min_length=1)
    grammar: str | None = None
    json_object: bool | None = None
    whitespace_flexible: bool = True

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputsParams:
        given = [name for name in CONSTRAINTS if _value(self, name) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"set exactly one of {', '.join(CONSTRAINTS)} (got {', '.join(given) or 'none'})")
        return self

    @property
    def kind(self) -> str:
        """The constraint set: one of :data:`CONSTRAINTS`."""
        return next(name for name in CONSTRAINTS if _value(self, name) not in (None, False))

    @property
    def value(self) -> Any:
        """The constraint's value (the schema, regex, choices or grammar)."""
        return _value(self, self.kind)


#: TensorRT-LLM's name for the same parameters.
GuidedDecodingParams = StructuredOutputsParams
