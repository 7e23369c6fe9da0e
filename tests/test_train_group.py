"""`specdec train` gathers its commands from plugins (specdec_train_commands), one name per command."""

from __future__ import annotations

import click
import pytest

from specdec import hookimpl
from specdec.cli.main import main
from specdec.plugins import get_registry


class _Contributes:
    def __init__(self, *names: str) -> None:
        self.commands = [click.Command(name, callback=lambda name=name: click.echo(f"ran {name}")) for name in names]

    @hookimpl
    def specdec_train_commands(self) -> list[click.Command]:
        return self.commands


@pytest.fixture
def contribute():
    manager = get_registry().manager
    added = []

    def register(*names: str) -> None:
        plugin = _Contributes(*names)
        manager.register(plugin)
        added.append(plugin)

    yield register
    for plugin in added:
        manager.unregister(plugin)


def test_plugin_command_runs_under_train(contribute, capsys: pytest.CaptureFixture[str]) -> None:
    contribute("toy-head")
    assert main(["train", "toy-head"]) == 0
    assert "ran toy-head" in capsys.readouterr().out


def test_same_name_from_two_plugins_is_an_error(contribute, capsys: pytest.CaptureFixture[str]) -> None:
    contribute("toy-head")
    contribute("toy-head")
    assert main(["train", "toy-head"]) == 2
    assert "the training command 'toy-head' is contributed twice" in capsys.readouterr().err


def test_a_plugin_cannot_take_the_cores_draft_vocab_command(contribute, capsys: pytest.CaptureFixture[str]) -> None:
    """`draft-vocab` belongs to the core (every drafter's draft vocabulary): a plugin contributing
    a command of that name is an error, not a silent replacement."""
    contribute("draft-vocab")
    assert main(["train", "draft-vocab"]) == 2
    assert "the training command 'draft-vocab' is contributed twice" in capsys.readouterr().err
