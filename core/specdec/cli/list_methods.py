"""``specdec list-methods``: installed methods and plugins that failed to load."""

from __future__ import annotations

import json

import click
from rich.markup import escape
from rich.table import Table

from specdec.errors import ConfigError
from specdec.kernels import describe as describe_verify_backend
from specdec.plugins import get_registry
from specdec.progress import log_console


@click.command("list-methods")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list for machines.")
@click.option("--options", is_flag=True, help="Also show each method's options (from its config schema).")
def list_methods(as_json: bool, options: bool) -> None:
    """List speculation methods: name, aliases, distribution, version, summary."""
    registry = get_registry()
    rows = []
    for info in sorted(registry.methods.values(), key=lambda m: m.name):
        try:
            schema = info.config_class.model_json_schema()
        except Exception:  # a config with exotic field types still gets listed
            schema = {}
        rows.append({
            "name": info.name,
            "aliases": list(info.aliases),
            "distribution": info.distribution,
            "version": info.version,
            "summary": info.summary,
            "status": "ok",
            "options": {k: {"type": v.get("type", v.get("anyOf", "")), "default": v.get("default"), "description": v.get("description", "")}
                        for k, v in schema.get("properties", {}).items()},
        })
    for broken in registry.broken:
        rows.append({"name": broken.name, "aliases": [], "distribution": broken.distribution, "version": broken.version,
                     "summary": "", "status": "error", "error": broken.error, "options": {}})
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    table = Table(title="speculation methods")
    for col in ("method", "aliases", "distribution", "version", "summary"):
        table.add_column(col)
    for row in rows:
        if row["status"] == "error":
            table.add_row(f"[red]{row['name']}[/]", "", row["distribution"] or "", row["version"] or "", f"[red]failed to load: {escape(row['error'])}[/]")
        else:
            table.add_row(row["name"], ", ".join(row["aliases"]), row["distribution"] or "(in-process)", row["version"] or "", escape(row["summary"]))
    console = log_console()
    console.print(table)
    try:
        console.print(f"verify step: {describe_verify_backend()}")
    except ConfigError as exc:
        console.print(f"verify step: [red]{exc}[/]")
    if options:
        for row in rows:
            if row["options"]:
                opts = Table(title=f"{row['name']} options", title_justify="left")
                for col in ("option", "default", "description"):
                    opts.add_column(col)
                for name, spec in row["options"].items():
                    opts.add_row(name, escape(repr(spec["default"])), escape(spec["description"]))
                console.print(opts)
