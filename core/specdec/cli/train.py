"""``specdec train``: a group whose commands come from plugins (``specdec_train_commands``)."""

from __future__ import annotations

import click

from specdec.errors import PluginError
from specdec.plugins import get_registry


def plugin_train_commands() -> dict[str, click.Command]:
    """Every command the loaded plugins contribute, by name; a name used twice is an error."""
    commands: dict[str, click.Command] = {}
    for contributed in get_registry().hook.specdec_train_commands():
        for command in contributed or []:
            if command.name in commands:
                raise PluginError(f"two plugins contribute the training command {command.name!r}")
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
    """Train drafters (commands contributed by the installed method plugins)."""
