"""Sequence capacity: how many concurrent sequences of a given length a certified placement holds.

KV lives in a pool of 64-position blocks on every stage (``spec/kv_pool.py``). By default the pool
gives every sequence slot its whole context, so capacity is per stage: the most ``batch`` whose
charge (``stage_charge`` with that batch, the same accounting the certificate uses) stays within
the stage's own device budget, with the blocks where the placement put them. With a sized pool
(``kv_tokens``) the pool is fixed: ``pool blocks // blocks per sequence`` sequences of a length fit
at once (``limited_by`` = ``kv pool``), and never more than the stages' budgets allow. The
placement's capacity is its tightest stage's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from stagewise.placement.certified_placement import CertifiedPlacement
from stagewise.spec.charge import stage_charge
from stagewise.spec.kv_pool import KV_BLOCK_TOKENS, SCRATCH_BLOCKS, blocks_for
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.profile import Profile

MAX_REPORTED_SEQUENCES = 4096  # Profile's batch limit
REPORTED_CONTEXTS = (1024, 4096, 32768, 131072)
POOL_LIMIT = "kv pool"  # limited_by when a sized pool, not a device budget, binds


@dataclass(frozen=True)
class SequenceCapacity:
    """``sequences`` slots of ``context_tokens`` each fit on every stage; ``limited_by`` names the
    device of the tightest stage (0 sequences: not even one fits at this context)."""

    context_tokens: int
    sequences: int
    limited_by: str

    def to_dict(self) -> dict[str, Any]:
        return {"context_tokens": self.context_tokens, "sequences": self.sequences, "limited_by": self.limited_by}


def with_batch(profile: Profile, batch: int, **changes: Any) -> Profile:
    """``profile`` with ``batch`` slots, as capacity counts them: when it keeps a prefix snapshot per slot
    (``serve``'s default) the snapshots take what the sequences leave (``fit_profile``), so none is
    charged against a sequence; a set number of snapshots stays charged."""
    snapshots = 0 if profile.prefix_snapshots == profile.batch else profile.prefix_snapshots
    return replace(profile, batch=batch, prefix_snapshots=snapshots, **changes)


def _fits(cert: CertifiedPlacement, spec: ModelSpec, profile: Profile) -> str | None:
    """The first stage's device over its budget under ``profile``, or None when all fit."""
    for stage in cert.stages:
        sp = stage.placement
        charge = stage_charge(spec, profile, sp.start, sp.end, sp.entry, sp.exit)
        if charge.total_bytes > stage.budget_bytes:
            return sp.device_id
    return None


def sequence_capacity(cert: CertifiedPlacement, spec: ModelSpec, profile: Profile,
                      context_tokens: int) -> SequenceCapacity:
    """The most concurrent sequences of ``context_tokens`` the placement's stages hold (binary search
    over the batch; charges grow with it), and with a sized pool no more than its blocks hold."""
    base = with_batch(profile, 1, context_tokens=context_tokens)
    top = MAX_REPORTED_SEQUENCES
    if profile.kv_tokens is not None:
        top = min(top, profile.kv_pool_blocks // blocks_for(context_tokens))
        if top == 0:
            return SequenceCapacity(context_tokens, 0, POOL_LIMIT)
    limit = _fits(cert, spec, base)
    if limit is not None:
        return SequenceCapacity(context_tokens, 0, limit)
    lo, hi = 1, top
    if profile.kv_tokens is not None and _fits(cert, spec, with_batch(base, hi)) is None:
        return SequenceCapacity(context_tokens, hi, POOL_LIMIT if hi < MAX_REPORTED_SEQUENCES else "")
    if _fits(cert, spec, with_batch(base, hi)) is None:
        return SequenceCapacity(context_tokens, hi, "")
    while hi - lo > 1:  # lo fits, hi does not
        mid = (lo + hi) // 2
        if _fits(cert, spec, with_batch(base, mid)) is None:
            lo = mid
        else:
            hi = mid
    return SequenceCapacity(context_tokens, lo, _fits(cert, spec, with_batch(base, hi)) or "")


def longest_context(cert: CertifiedPlacement, spec: ModelSpec, profile: Profile) -> int:
    """The longest context one sequence can have on the placement's stages (whole KV blocks, the
    profile's chunk), up to the model's ``max_position_embeddings`` (or the profile's context when the
    model does not say); 0 when not even one block fits."""
    top = max(spec.max_context_tokens, profile.context_tokens) if spec.max_context_tokens else profile.context_tokens
    snapshots = 1 if profile.prefix_snapshots == profile.batch else profile.prefix_snapshots  # as fit_profile does
    base = replace(profile, batch=1, prefix_snapshots=snapshots, kv_tokens=None)
    if _fits(cert, spec, replace(base, context_tokens=top)) is None:
        return top
    lo, hi = 0, top // KV_BLOCK_TOKENS  # in blocks: lo fits (0: nothing known to), hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _fits(cert, spec, replace(base, context_tokens=mid * KV_BLOCK_TOKENS)) is None:
            lo = mid
        else:
            hi = mid
    return lo * KV_BLOCK_TOKENS


def longest_line(tokens: int, spec: ModelSpec) -> str:
    """``longest context for 1 sequence on this placement: 52,416 tokens (the model's maximum: 262,144)``."""
    if not tokens:
        return "longest context for 1 sequence on this placement: none (not even one KV block)"
    most = spec.max_context_tokens
    note = " (the model's maximum)" if most and tokens >= most else (f" (the model's maximum: {most:,})" if most else "")
    return f"longest context for 1 sequence on this placement: {tokens:,} tokens{note}"


def capacity_table(cert: CertifiedPlacement, spec: ModelSpec, profile: Profile) -> tuple[SequenceCapacity, ...]:
    """Capacity at the profile's context and at the usual lengths."""
    contexts = sorted({profile.context_tokens, *REPORTED_CONTEXTS})
    return tuple(sequence_capacity(cert, spec, profile, c) for c in contexts)


def pool_report(profile: Profile) -> dict[str, Any]:
    """The KV pool every stage holds under ``profile`` (JSON: ``kv_pool``)."""
    return {"blocks": profile.kv_pool_blocks, "block_tokens": KV_BLOCK_TOKENS, "tokens": profile.kv_pool_tokens,
            "scratch_blocks": SCRATCH_BLOCKS}


def pool_line(profile: Profile) -> str:
    """One line: ``KV pool per stage: 64 blocks of 64 positions (4,096 tokens, every slot its whole context)``."""
    how = "--kv-tokens" if profile.kv_tokens is not None else "every slot its whole context"
    return (f"KV pool per stage: {profile.kv_pool_blocks} blocks of {KV_BLOCK_TOKENS} positions "
            f"({profile.kv_pool_tokens:,} tokens, {how})")


def capacity_line(table: tuple[SequenceCapacity, ...], profile: Profile) -> str:
    """One line: ``concurrent sequences on this placement: 92 at 1,024, 23 at 4,096, … tokens each
    (limited by cuda:0)``, the device named for the profile's context."""
    parts = []
    for row in table:
        count = f"{row.sequences}+" if row.sequences == MAX_REPORTED_SEQUENCES else str(row.sequences)
        parts.append(f"{count} at {row.context_tokens:,}")
    tight = next((r.limited_by for r in table if r.context_tokens == profile.context_tokens and r.limited_by), "")
    suffix = f" (limited by {tight})" if tight else ""
    return "concurrent sequences on this placement: " + ", ".join(parts) + " tokens each" + suffix
