"""Typed errors for the user's mistakes.

Every error a user can cause derives from :class:`StagewiseError`; its message is one line
naming the file, tensor, device or field at fault. The CLI prints ``str(error)`` and exits
with :attr:`StagewiseError.exit_code`; the server maps :attr:`StagewiseError.http_status`.
"""

from __future__ import annotations


class StagewiseError(Exception):
    """Base of every error stagewise raises for bad input or impossible requests."""

    exit_code: int = 2
    http_status: int = 400
    code: str = "invalid_request_error"

    def __init__(self, message: str) -> None:
        super().__init__(message.replace("\n", " "))


class ModelNotFound(StagewiseError):
    """The model path does not exist or holds no model."""

    http_status = 404
    code = "model_not_found"


class ConfigError(StagewiseError):
    """A config.json or metadata field is missing or invalid."""


class UnsupportedArchitecture(StagewiseError):
    """The model_type / GGUF architecture is not one stagewise runs."""


class WeightsError(StagewiseError):
    """Weights are missing, unexpected, duplicated or mis-shaped."""


class CorruptModelFile(StagewiseError):
    """A weights file is truncated, malformed or internally inconsistent."""


class UnsupportedTensorType(StagewiseError):
    """A tensor is stored in a type stagewise cannot load."""


class TopologyError(StagewiseError):
    """A device spec or topology file is unreadable or invalid."""


class DoesNotFit(StagewiseError):
    """No legal placement exists on the given devices."""


class PlacementError(StagewiseError):
    """A requested placement (split, order, stage count) is illegal or unsupported."""


class StageOutOfMemory(StagewiseError):
    """A stage tried to allocate past its device budget."""

    http_status = 500
    code = "stage_out_of_memory"


class HandoffError(StagewiseError):
    """An activation arrived with metadata that does not match what the receiver expects."""

    http_status = 500
    code = "handoff_error"


class StepFailed(StagewiseError):
    """A pipeline step failed and was rolled back."""

    http_status = 500
    code = "step_failed"


class StepCancelled(StagewiseError):
    """A pipeline step was cancelled between stages and rolled back."""

    http_status = 499
    code = "cancelled"


class ContextLengthExceeded(StagewiseError):
    """A request needs more positions than the context allows."""

    code = "context_length_exceeded"


class RequestError(StagewiseError):
    """A malformed or unsupported request."""


class WorkerLost(StagewiseError):
    """A stage's worker process died, hung or left mid-request; the step was rolled back and the
    pipeline refuses requests until the worker rejoins."""

    exit_code = 3
    http_status = 503
    code = "worker_lost"


class WorkerNotJoined(StagewiseError):
    """A worker process did not join the coordinator (or did not load its stage) in time."""

    exit_code = 3
    http_status = 503
    code = "worker_not_joined"


class WorkerMessageRejected(StagewiseError):
    """A message through the worker store failed its signature (unsigned, forged, replayed) or its
    checks (types, sizes, ranges); it is dropped, never acted on."""

    exit_code = 3
    http_status = 503
    code = "worker_message_rejected"


class GrammarError(RequestError):
    """A structured-output constraint (JSON schema, forced tool call) that cannot be compiled, or that
    this model's tokenizer cannot be constrained with."""


class EngineDied(StagewiseError):
    """The engine process exited (crashed, killed); the requests it carried failed, and the server
    refuses new ones until a fresh engine process has loaded the model."""

    exit_code = 3
    http_status = 503
    code = "engine_died"


class EngineMessageRejected(StagewiseError):
    """A message between the API and engine processes that does not decode to a known, well-typed kind;
    it is dropped, never acted on."""

    exit_code = 3
    http_status = 503
    code = "engine_message_rejected"
