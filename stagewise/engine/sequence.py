"""Sequence: one request's life in the batcher — its state row, what it has computed and sampled,
the KV blocks of its positions and the sinks its tokens and errors go to."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from stagewise.engine.generation_request import GenerationRequest, TokenEvent
from stagewise.engine.sampling import Sampler
from stagewise.errors import StagewiseError

TokenSink = Callable[[TokenEvent], bool]  # False: end the sequence now (stop string, client gone)
ErrorSink = Callable[[StagewiseError], None]
CancelCheck = Callable[[], bool]


@dataclass(eq=False)
class Sequence:
    """One request's life in the batcher: its row, what it has computed and sampled, its sinks."""

    request: GenerationRequest
    on_token: TokenSink
    on_error: ErrorSink
    cancelled: CancelCheck
    sampler: Sampler = field(init=False)
    row: int = -1
    length: int = 0  # positions whose state is published (prompt then generated tokens)
    generated: int = 0  # tokens sampled (and reported)
    next_token: int = 0  # the last sampled token: the next decode step's input
    tokens: list[int] = field(default_factory=list)  # the sampled tokens, in order (recomputed after a preemption)
    ids: tuple[int, ...] = ()  # what the staging row prefills: the prompt, plus tokens[:-1] after a preemption
    prefilled: int = 0  # of ``ids``, positions already run
    blocks: list[int] = field(default_factory=list)  # KV blocks of its positions, in order (a cached prefix's shared)
    cached_tokens: int = 0  # prompt positions its (latest) start took from the prefix cache
    restored: int = -1  # the prefix snapshot entry its row reads until its first step runs (-1: none)
    shared_tokens: int = 0  # where its ids part from cached ones when it started, or from a prompt waiting for it (a snapshot point)
    prefix_keys: tuple[bytes, ...] = ()  # the prefix keys of ``ids``' full blocks (prefix cache)
    prefix_keys_of: int = -1  # the length of ``ids`` those keys are of
    admitted: int = -1  # admission order (starts in the staging row); the largest is preempted first
    preemptions: int = 0
    budget: int = 0  # tokens it may generate
    done: bool = False
    errored: bool = False  # ended by an error or cancellation (its pending tokens are not reported)

    def __post_init__(self) -> None:
        self.sampler = Sampler(self.request.sampling)

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def device_greedy(self) -> bool:
        return self.sampler.plain_greedy(self.request.top_logprobs)
