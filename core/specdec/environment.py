"""Reading specdec's environment variables."""

from __future__ import annotations

import os

from specdec.errors import ConfigError


def env_choice(name: str, choices: tuple[str, ...]) -> str:
    """The value of environment variable ``name``, lower-cased, one of ``choices``.

    Unset or empty gives ``choices[0]`` (the default); anything else is a ``ConfigError`` naming
    the variable and the values it takes.
    """
    value = os.environ.get(name, "").strip().lower() or choices[0]
    if value not in choices:
        raise ConfigError(f"{name}: expected one of {', '.join(choices)}, got {value!r}")
    return value
