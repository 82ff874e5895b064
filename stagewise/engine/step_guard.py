"""StepGuard: the pipeline's fault hook — cancellation before every step, and injected faults."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from stagewise.errors import StepCancelled


class InjectedFault(RuntimeError):
    """Raised inside a stage by :meth:`StepGuard.fail_next_step` (tests and qualification only)."""


class StepGuard:
    """Called by :class:`Pipeline` before each stage of each step, as ``guard(stage, step_id)``.

    Before stage 0 it checks ``cancel`` (the pipeline itself checks between stages), so a
    cancelled request stops within one step even on a one-stage pipeline or during a
    multi-chunk prefill. A pending injected fault raises in its stage; the pipeline then rolls
    back and reports ``StepFailed``. ``delay_s`` slows every step (a slow-stage simulation for
    lifecycle tests: queue-full, disconnects and draining need requests that last).
    """

    def __init__(self) -> None:
        self.cancel: Callable[[], bool] | None = None
        self._lock = threading.Lock()
        self._fail_stage: int | None = None
        self.delay_s = 0.0

    def fail_next_step(self, stage: int) -> None:
        with self._lock:
            self._fail_stage = stage

    def __call__(self, stage: int, step_id: int) -> None:
        if stage == 0 and self.delay_s > 0:
            time.sleep(self.delay_s)
        if stage == 0 and self.cancel is not None and self.cancel():
            raise StepCancelled(f"step {step_id} cancelled before it started")
        with self._lock:
            fail = self._fail_stage == stage
            if fail:
                self._fail_stage = None
        if fail:
            raise InjectedFault(f"injected fault in stage {stage}")
