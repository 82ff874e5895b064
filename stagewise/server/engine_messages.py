"""The messages between the API process and the engine process: one frozen msgspec struct per kind.

API → engine (:data:`ToEngine`): :class:`Submit` (a tokenized request), :class:`Cancel`,
:class:`MetricsQuery`, :class:`FailNextStep` / :class:`StepDelay` (fault injection), :class:`Drain`, then
:class:`Exit`.
Engine → API (:data:`FromEngine`): :class:`Phase` and :class:`Ready` (or :class:`LoadFailed`) while
starting, :class:`Admitted` (one per :class:`Submit`), :class:`StepOutputs` (every output of one engine
step, each request's newly completed text, token count, logprobs and finish), :class:`MetricsReply`,
:class:`Health` (the worker processes' liveness, when it changes), :class:`Alive` (after a second with
nothing else sent: the API process's proof that the engine loop turns) and :class:`Drained`.

Each struct is tagged with its kind (``{"kind": "submit", ...}``), so a message decodes to exactly one
type; :mod:`stagewise.server.message_codec` encodes and checks them.
"""

from __future__ import annotations

from msgspec import Struct


class ErrorRecord(Struct, frozen=True):
    """A typed error crossing the boundary: its class name (one of the codec's known errors) and text."""

    kind: str
    message: str
    param: str | None = None
    code: str | None = None  # when it differs from the class's own


class GrammarRecord(Struct, frozen=True):
    """A grammar compiled (and so validated) by the API process: llguidance's JSON, recompiled by the engine."""

    definition: str
    description: str


class SamplingRecord(Struct, frozen=True):
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    presence_penalty: float
    frequency_penalty: float
    seed: int | None
    logit_bias: tuple[tuple[int, float], ...]
    grammar: GrammarRecord | None


class Submit(Struct, frozen=True, tag="submit", tag_field="kind"):
    key: int  # unique per API process: client-chosen request ids may repeat
    request_id: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingRecord
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    logprobs: bool
    top_logprobs: int


class Cancel(Struct, frozen=True, tag="cancel", tag_field="kind"):
    key: int


class MetricsQuery(Struct, frozen=True, tag="metrics_query", tag_field="kind"):
    query_id: int


class FailNextStep(Struct, frozen=True, tag="fail_next_step", tag_field="kind"):
    stage: int


class StepDelay(Struct, frozen=True, tag="step_delay", tag_field="kind"):
    delay_s: float


class Drain(Struct, frozen=True, tag="drain", tag_field="kind"):
    grace_s: float


class Exit(Struct, frozen=True, tag="exit", tag_field="kind"):
    """After :class:`Drained`: close the model and exit (so the exit is never taken for a death)."""


ToEngine = Submit | Cancel | MetricsQuery | FailNextStep | StepDelay | Drain | Exit


class TokenizerRecord(Struct, frozen=True):
    backend_json: str  # the `tokenizers` library's own serialization
    bos_token_id: int | None
    eos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    unk_token_id: int | None
    chat_template: str | None


class ModelRecord(Struct, frozen=True):
    """What the API process needs of the model the engine process loaded (no weights)."""

    name: str
    vocab_size: int
    max_context: int
    stop_token_ids: tuple[int, ...]
    tokenizer: TokenizerRecord
    chat_template: str
    stages: int
    slots: int
    placement_json: str  # the status endpoint's placement view


class Phase(Struct, frozen=True, tag="phase", tag_field="kind"):
    phase: str  # "warming_up"


class Ready(Struct, frozen=True, tag="ready", tag_field="kind"):
    model: ModelRecord
    pid: int


class LoadFailed(Struct, frozen=True, tag="load_failed", tag_field="kind"):
    error: ErrorRecord


class Admitted(Struct, frozen=True, tag="admitted", tag_field="kind"):
    key: int
    error: ErrorRecord | None  # QueueFull, ContextLengthExceeded, ...: nothing was queued


class LogprobRecord(Struct, frozen=True):
    token: str
    logprob: float
    bytes: tuple[int, ...]
    top: tuple[tuple[str, float, tuple[int, ...]], ...]


class OutputRecord(Struct, frozen=True):
    key: int
    text: str
    prompt_tokens: int
    completion_tokens: int
    logprobs: tuple[LogprobRecord, ...]
    finish_reason: str | None
    error: ErrorRecord | None
    cached_tokens: int
    stop_string: str | None = None


class StepOutputs(Struct, frozen=True, tag="step_outputs", tag_field="kind"):
    outputs: tuple[OutputRecord, ...]


class SampleRecord(Struct, frozen=True):
    name: str
    labels: dict[str, str]
    value: float


class FamilyRecord(Struct, frozen=True):
    name: str
    documentation: str
    type: str
    samples: tuple[SampleRecord, ...]


class MetricsReply(Struct, frozen=True, tag="metrics_reply", tag_field="kind"):
    query_id: int
    families: tuple[FamilyRecord, ...]


class Health(Struct, frozen=True, tag="health", tag_field="kind"):
    report_json: str | None  # the pipeline's worker report, None for an in-process pipeline


class Drained(Struct, frozen=True, tag="drained", tag_field="kind"):
    clean: bool


class Alive(Struct, frozen=True, tag="alive", tag_field="kind"):
    """Nothing else was sent for a while; the engine's loop still turns."""


FromEngine = Phase | Ready | LoadFailed | Admitted | StepOutputs | MetricsReply | Health | Drained | Alive
