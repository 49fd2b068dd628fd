"""Progress on stderr for a long step: a rich bar when stderr is a terminal, nothing
with -q or when it is not (a pipe, a log, CI)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def progress_bar(what: str, quiet: bool, unit: str = "events"
                 ) -> Iterator[Callable[[int, int], None] | None]:
    """``tick(done, total)`` for a long step (``unit`` done of about ``total``; total 0:
    unknown), or None with -q or when stderr is not a terminal."""
    if quiet or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn(f"{{task.completed:,.0f}} {unit}"), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=None)

        def tick(done: int, total: int) -> None:
            bar.update(task, completed=done, total=max(total, done) or None)

        yield tick
