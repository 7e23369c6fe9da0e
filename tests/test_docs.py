"""Keep docs/ in step with the code: hook signatures and config fields."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from specdec import hookspecs
from specdec.plugins import get_registry

DOCS = Path(__file__).resolve().parent.parent / "docs"

#: A hook section heading in hooks.md: ``### specdec_name(arg1, arg2)``.
HOOK_HEADING = re.compile(r"^###\s+`?(specdec_\w+)\(([^)]*)\)`?\s*$", re.MULTILINE)


def _hookspecs() -> dict[str, list[str]]:
    """Every hookspec in specdec.hookspecs: name -> parameter names, in order."""
    return {
        name: list(inspect.signature(func).parameters)
        for name, func in vars(hookspecs).items()
        if name.startswith("specdec_") and inspect.isfunction(func)
    }


def _documented_hooks() -> dict[str, list[str]]:
    text = (DOCS / "hooks.md").read_text()
    documented: dict[str, list[str]] = {}
    for name, args in HOOK_HEADING.findall(text):
        assert name not in documented, f"hooks.md documents {name} twice"
        documented[name] = [a.strip() for a in args.split(",") if a.strip()]
    return documented


def test_hookspecs_found() -> None:
    """The hookspec scan sees the hooks at all (guards the other tests against passing vacuously)."""
    specs = _hookspecs()
    assert "specdec_verify" in specs and len(specs) >= 4


@pytest.mark.parametrize("name", sorted(_hookspecs()))
def test_hook_documented_with_current_signature(name: str) -> None:
    """docs/hooks.md has a heading ``specdec_<name>(<params>)`` with exactly the hookspec's
    current parameter names, in order."""
    documented = _documented_hooks()
    expected = _hookspecs()[name]
    assert name in documented, f"docs/hooks.md has no '### {name}({', '.join(expected)})' section"
    assert documented[name] == expected, (
        f"docs/hooks.md documents {name}({', '.join(documented[name])}); "
        f"the hookspec is {name}({', '.join(expected)})"
    )


def test_no_documented_hook_is_missing_from_hookspecs() -> None:
    """docs/hooks.md documents no hook that specdec.hookspecs does not define."""
    extra = sorted(set(_documented_hooks()) - set(_hookspecs()))
    assert not extra, f"docs/hooks.md documents hooks that do not exist: {extra}"


def _config_fields() -> list[tuple[str, str]]:
    registry = get_registry()
    return [
        (method, field)
        for method, info in sorted(registry.methods.items())
        for field in info.config_class.model_fields
    ]


def test_installed_methods_found() -> None:
    """The registry lists the built-in methods, so the field check below is not vacuous."""
    assert {"none", "user_provided"} <= set(get_registry().methods)


@pytest.mark.parametrize(("method", "field"), _config_fields())
def test_config_field_documented(method: str, field: str) -> None:
    """Every field of each installed method's config class appears by name, as code, in
    docs/configuration.md."""
    text = (DOCS / "configuration.md").read_text()
    assert f"`{field}`" in text, f"docs/configuration.md does not mention {method}'s field `{field}`"
