"""rich progress bars and tables that also reach a log file.

rich draws a progress bar only on a terminal; with stderr sent to a file (``nohup specdec train
... > log``), the bar stays silent until the job ends. :class:`Progress` then prints the tasks as
plain lines every ``log_every`` seconds instead, so a background job's log shows how far it got.
"""

from __future__ import annotations

import io
import time
from typing import Any

from rich import progress as rich_progress
from rich.console import Console
from rich.progress import ProgressColumn, TaskID

LOG_WIDTH = 160


def log_console(**kwargs: Any) -> Console:
    """A rich console, :data:`LOG_WIDTH` columns wide when it writes to a file rather than a
    terminal: rich's default of 80 then cuts a wide table's columns to a few letters."""
    console = Console(**kwargs)
    if console.is_terminal or "width" in kwargs:
        return console
    return Console(width=LOG_WIDTH, **kwargs)


class Progress(rich_progress.Progress):
    """:class:`rich.progress.Progress`, which logs plain lines when its console is not a terminal."""

    def __init__(self, *columns: str | ProgressColumn, log_every: float = 30.0, **kwargs: Any) -> None:
        super().__init__(*columns, **kwargs)
        self.log_every = log_every
        self._logged = time.monotonic()

    def update(self, task_id: TaskID, **kwargs: Any) -> None:
        super().update(task_id, **kwargs)
        self._log(task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._log(task_id)

    def _log(self, task_id: TaskID) -> None:
        if self.console.is_terminal or time.monotonic() - self._logged < self.log_every:
            return
        self._logged = time.monotonic()
        task = next(t for t in self.tasks if t.id == task_id)
        # A log file has no width of its own, and rich's default of 80 columns cuts fields short.
        line = Console(file=io.StringIO(), width=max(self.console.width, LOG_WIDTH), color_system=None)
        line.print(self.make_tasks_table([task]))
        self.console.out(line.file.getvalue().rstrip(), highlight=False)
