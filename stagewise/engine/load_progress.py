"""LoadProgress: a rich progress bar per stage while weights stream to their devices."""

from __future__ import annotations

import sys
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TransferSpeedColumn

from stagewise.placement import CertifiedPlacement


class LoadProgress:
    """Context manager; ``start(cert)`` creates one bar per stage, ``update(stage, name, bytes)`` advances it."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                 TransferSpeedColumn(), console=Console(stderr=True), disable=not self.enabled)
        self.tasks: dict[int, TaskID] = {}

    def __enter__(self) -> LoadProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.progress.__exit__(et, ev, tb)

    def start(self, cert: CertifiedPlacement) -> None:
        for k, st in enumerate(cert.stages):
            p = st.placement
            desc = f"stage {k} {p.device_id} blocks {p.start}-{p.end - 1}"
            self.tasks[k] = self.progress.add_task(desc, total=st.charge.weights_bytes)

    def update(self, stage: int, name: str, nbytes: int) -> None:
        if stage in self.tasks:
            self.progress.advance(self.tasks[stage], nbytes)
