"""prefix_root: whether a pipeline's KV blocks may be shared by prompt prefix, and the root of its
prefix keys (the model's identity)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stagewise.engine.block_hashes import model_key

if TYPE_CHECKING:
    from stagewise.runtime.executor import Executor


def prefix_root(pipeline: Executor) -> bytes | None:
    """The root key of ``pipeline``'s prefix cache: the hash of its model's config (the cache lives and
    dies with the pipeline, so its weights are fixed). None where prefix caching does not apply: no KV
    pool, or stages that hold recurrent state (a linear-attention row's state is not in its KV blocks)
    but no snapshot entries for it (:mod:`~stagewise.engine.prefix_snapshots`)."""
    if pipeline.kv_pool is None:
        return None
    if holds_recurrent_state(pipeline) and not pipeline.snapshot_entries:
        return None
    return model_key(repr(pipeline.stages[0].model.config))


def holds_recurrent_state(pipeline: Executor) -> bool:
    """Whether a stage of ``pipeline`` keeps recurrent (linear-attention) state."""
    return any(stage.recurrent for stage in pipeline.stages)
