"""``specdec train``: the core's ``draft-vocab`` and the commands plugins contribute (``specdec_train_commands``)."""

from __future__ import annotations

import click

from specdec.errors import PluginError
from specdec.plugins import get_registry


def plugin_train_commands() -> dict[str, click.Command]:
    """The core's commands and every command the loaded plugins contribute, by name; a name used
    twice is an error."""
    from specdec.cli.train_vocab import train_draft_vocab

    commands: dict[str, click.Command] = {train_draft_vocab.name: train_draft_vocab}
    for contributed in get_registry().hook.specdec_train_commands():
        for command in contributed or []:
            if command.name in commands:
                raise PluginError(f"the training command {command.name!r} is contributed twice (by a plugin and the core or another plugin)")
            commands[command.name] = command
    return commands


class PluginCommandGroup(click.Group):
    """Looks its commands up in the plugins only when listed or run, not on import."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(plugin_train_commands())

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return plugin_train_commands().get(cmd_name)


@click.group(cls=PluginCommandGroup)
def train() -> None:
    """Train drafters (commands contributed by the installed method plugins) and rank draft vocabularies."""
