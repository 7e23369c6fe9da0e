"""Progress bars log plain lines where rich cannot draw (a log file), and stay quiet on a terminal."""

import io

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn

from specdec.progress import Progress


def run(console: Console) -> str:
    with Progress(TextColumn("training"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]:.2f}"),
                  TextColumn("accuracy per step 0.58 0.51 0.48 0.45"), console=console, log_every=0.0,
                  auto_refresh=False) as progress:
        task = progress.add_task("fit", total=3, loss=9.0)
        for step in range(3):
            progress.update(task, advance=1, loss=3.0 - step)
    return console.file.getvalue()


def test_a_log_file_gets_a_line_per_update():
    """Each line holds every field, even where the console's width (80 for a file) would cut them."""
    out = run(Console(file=io.StringIO(), force_terminal=False, width=40))
    lines = [line for line in out.splitlines() if "loss" in line]
    assert all("0.58 0.51 0.48 0.45" in line for line in lines)
    assert "1/3" in lines[0] and "loss 3.00" in lines[0]
    assert any("2/3" in line and "loss 2.00" in line for line in lines)
    assert "3/3" in lines[-1] and "loss 1.00" in lines[-1]


def test_a_terminal_gets_the_bar_only():
    """On a terminal rich draws the bar; no plain lines of the intermediate steps are added."""
    out = run(Console(file=io.StringIO(), force_terminal=True, width=100))
    assert "3/3" in out and "1/3" not in out and "2/3" not in out


def test_tables_in_a_log_file_keep_every_column():
    """`bench`'s table printed to a file: 160 columns wide, so no header or figure is cut to '…'."""
    from rich.table import Table

    from specdec.progress import LOG_WIDTH, log_console

    console = log_console(file=io.StringIO(), force_terminal=False)
    assert console.width == LOG_WIDTH
    table = Table()
    for column in ["category", "turns", "speedup", "95% interval", "vs hf", "tok/s", "mean acc. tokens",
                   "accept rate", "outputs match", "overhead"]:
        table.add_column(column)
    table.add_row("humanities", "4", "0.66x", "0.62-0.69x", "0.81x", "23.3", "1.48", "12.2%", "25%", "1.1%")
    console.print(table)
    out = console.file.getvalue()
    assert "…" not in out and "mean acc. tokens" in out and "0.62-0.69x" in out
    plain = Console(file=io.StringIO(), force_terminal=False)
    plain.print(table)
    assert "…" in plain.file.getvalue()  # what rich's default width does to it
    assert log_console(file=io.StringIO(), force_terminal=False, width=50).width == 50
