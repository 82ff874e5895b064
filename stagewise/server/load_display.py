"""Loading display: a rich progress bar per stage (bytes loaded) and the placement banner."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TransferSpeedColumn

from stagewise.engine.loaded_model import LoadedModel, StageProgress
from stagewise.hardware.sizes import format_bytes


@contextmanager
def stage_progress(console: Console) -> Iterator[StageProgress]:
    """A ``(stage, tensor name, bytes)`` callback that drives one progress bar per stage."""
    progress = Progress(TextColumn("[bold]stage {task.fields[stage]}"), BarColumn(), DownloadColumn(),
                        TransferSpeedColumn(), TextColumn("{task.description}"), console=console, transient=False)
    tasks: dict[int, TaskID] = {}
    lock = threading.Lock()

    def update(stage: int, name: str, nbytes: int) -> None:
        with lock:
            if stage not in tasks:
                tasks[stage] = progress.add_task("", total=None, stage=stage)
            progress.update(tasks[stage], advance=nbytes, description=name)

    with progress:
        yield update
        with lock:
            for task in tasks.values():
                done = progress.tasks[task].completed
                progress.update(task, total=done, completed=done, description="loaded")


def placement_lines(model: LoadedModel) -> list[str]:
    """The placement summary and, per stage, planned vs measured charge."""
    lines = [model.placement_summary]
    for check in model.charge_checks():
        measured = format_bytes(check.measured_bytes)
        if check.planned_bytes:
            lines.append(f"  stage {check.stage} on {check.device}: planned {format_bytes(check.planned_bytes)}"
                         f" · measured {measured} (planned/measured {check.ratio:.2f})")
        else:
            lines.append(f"  stage {check.stage} on {check.device}: measured {measured} (no planned charge)")
    return lines
