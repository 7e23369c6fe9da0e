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
