"""StepGuard: the pipeline's fault hook — injected faults and a per-step delay (tests, qualification)."""

from __future__ import annotations

import threading
import time


class InjectedFault(RuntimeError):
    """Raised inside a stage by :meth:`StepGuard.fail_next_step` (tests and qualification only)."""


class StepGuard:
    """Called by :class:`Pipeline` before each stage of each step, as ``guard(stage, step_id)``.

    A pending injected fault raises in its stage; the pipeline then rolls back and reports
    ``StepFailed`` (cancellation is the pipeline's own check, before and between stages). ``delay_s`` slows every step (a slow-stage simulation for
    lifecycle tests: queue-full, disconnects and draining need requests that last).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fail_stage: int | None = None
        self.delay_s = 0.0

    def fail_next_step(self, stage: int) -> None:
        with self._lock:
            self._fail_stage = stage

    def __call__(self, stage: int, step_id: int) -> None:
        if stage == 0 and self.delay_s > 0:
            time.sleep(self.delay_s)
        with self._lock:
            fail = self._fail_stage == stage
            if fail:
                self._fail_stage = None
        if fail:
            raise InjectedFault(f"injected fault in stage {stage}")
