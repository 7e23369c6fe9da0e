"""Entry point: dispatch subcommands; any bad input becomes one line on stderr and exit code 2."""

from __future__ import annotations

import sys

import click
from rich.console import Console

from specdec.cli.bench import bench
from specdec.cli.bench_kernels import bench_kernels
from specdec.cli.generate import generate
from specdec.cli.list_methods import list_methods
from specdec.cli.serve import serve
from specdec.cli.synthesize import synthesize
from specdec.cli.train import train
from specdec.cli.validate import validate
from specdec.errors import SpecdecError

EXIT_BAD_INPUT = 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specdec")
def cli() -> None:
    """Lossless speculative decoding for Hugging Face transformers models."""


cli.add_command(list_methods)
cli.add_command(generate)
cli.add_command(serve)
cli.add_command(bench)
cli.add_command(bench_kernels)
cli.add_command(synthesize)
cli.add_command(train)
cli.add_command(validate)


def main(argv: list[str] | None = None) -> int:
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        cli.main(args=argv, prog_name="specdec", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        err.print("error: aborted")
        return 1
    except click.ClickException as exc:
        err.print(f"error: {exc.format_message()}", markup=False)
        return EXIT_BAD_INPUT
    except SpecdecError as exc:
        # One line, whatever the message holds (a plugin's exception text may span several).
        err.print("error: " + " ".join(str(exc).split()), markup=False)
        return EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
