"""fit_profile: the one profile a load runs under, decided once from what was asked and what fits.

A :class:`ProfileRequest` says what the user set; ``None`` fields are decided here:

* ``context_tokens`` None: the longest context (whole 64-position blocks, within the model's
  ``max_position_embeddings``) that fits the request's sequences on the fewest devices that hold
  the model at the default context.
* ``context_tokens`` set and it does not fit: with ``batch`` None (``--max-seqs auto``) sequences go
  first (down to 1), then, with ``prefill_chunk_tokens`` None, the prefill chunk halves down to
  :data:`MIN_TRADED_CHUNK_TOKENS`; then the load is refused with the first attempt's reason.
* ``batch`` None: the most of :data:`AUTO_BATCHES` that fit on as many devices as one sequence needs.
* ``prefix_snapshots`` None: one recurrent-state snapshot entry per sequence slot (hybrids' prefix
  cache) where they fit; where they do not, as many as fit beside the sequences (down to none): a
  snapshot is a cache and never costs a sequence, a context position or the chunk a set context
  keeps. The longest context of an unset one is measured with the full snapshots (the cache stays on).

The answer (:class:`FittedProfile`) carries the certificate of that profile and one line saying
what was chosen. No torch: ``load_model`` and ``assess``/``plan`` call it alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from stagewise.errors import DoesNotFit, PlacementError
from stagewise.hardware.topology import Topology
from stagewise.placement.certified_placement import CertifiedPlacement
from stagewise.placement.planner import plan
from stagewise.spec.kv_pool import KV_BLOCK_TOKENS
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.profile import DEFAULT_CONTEXT_TOKENS, DEFAULT_PREFILL_CHUNK_TOKENS, Profile

AUTO_BATCHES = (64, 32, 16, 8, 4, 2, 1)  # `--max-seqs auto`: the most of these that fit
MIN_TRADED_CHUNK_TOKENS = 128  # a set context may shrink an unset prefill chunk down to this


@dataclass(frozen=True)
class ProfileRequest:
    """What a load asks for; ``None``: decide. ``base`` carries the fixed parts (dtypes, runtime
    workspace, ``kv_tokens``); its context, batch and chunk are replaced."""

    base: Profile
    context_tokens: int | None = None
    batch: int | None = 1
    prefill_chunk_tokens: int | None = None
    prefix_snapshots: int | None = None  # None: one recurrent-state snapshot entry per sequence slot

    def with_batch(self, profile: Profile, batch: int) -> Profile:
        """``profile`` with ``batch`` slots (and, unless set, as many prefix snapshots)."""
        snapshots = batch if self.prefix_snapshots is None else self.prefix_snapshots
        return replace(profile, batch=batch, prefix_snapshots=snapshots)


@dataclass(frozen=True)
class FittedProfile:
    """The decided profile, its certificate, and ``choice``: one line saying what was chosen."""

    profile: Profile
    cert: CertifiedPlacement
    choice: str


def fit_profile(spec: ModelSpec, topology: Topology, request: ProfileRequest, objective: str = "latency",
                stages: int | None = None) -> FittedProfile:
    """Decide the profile of ``request`` (see the module docstring) on ``topology``; ``stages``: exactly
    that many (``--placement``). Raises :class:`~stagewise.errors.DoesNotFit` with the reason when nothing
    fits, :class:`PlacementError` for a placement that cannot be honoured."""

    def attempt(profile: Profile, k: int | None = None) -> CertifiedPlacement | None:
        try:
            cert = plan(spec, topology, profile, objective=objective, stages=k or stages)
        except PlacementError:
            if k is None and stages is None:
                raise
            return None  # no legal placement with exactly that many stages
        return cert if cert.fits else None

    def attempt_auto(profile: Profile, k: int | None = None) -> tuple[Profile, CertifiedPlacement] | None:
        """``profile``, or with auto snapshots the most of them that fit beside its sequences."""
        cert = attempt(profile, k)
        if cert is not None:
            return profile, cert
        if request.prefix_snapshots is not None or not profile.prefix_snapshots:
            return None
        if (bare := attempt(replace(profile, prefix_snapshots=0), k)) is None:
            return None
        lo, hi, best = 0, profile.prefix_snapshots, bare  # lo snapshots fit, hi do not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if (found := attempt(replace(profile, prefix_snapshots=mid), k)) is not None:
                lo, best = mid, found
            else:
                hi = mid
        return replace(profile, prefix_snapshots=lo), best

    batch = request.batch or 1
    chunk = request.prefill_chunk_tokens or DEFAULT_PREFILL_CHUNK_TOKENS
    longest = spec.max_context_tokens or DEFAULT_CONTEXT_TOKENS
    first = request.with_batch(replace(request.base, context_tokens=request.context_tokens or min(DEFAULT_CONTEXT_TOKENS,
                                                                                                  longest),
                                       prefill_chunk_tokens=chunk), batch)
    why: list[str] = []
    if request.context_tokens is not None:
        fitted = attempt_auto(first)
        chunks = [] if request.prefill_chunk_tokens is not None else _smaller_chunks(chunk)
        for smaller in chunks:
            if fitted is not None:
                break
            fitted = attempt_auto(replace(first, prefill_chunk_tokens=smaller))
        if fitted is None:
            _refuse(spec, topology, first, objective, stages, tried=chunks)
        assert fitted is not None
        profile, cert = fitted
        if profile.prefill_chunk_tokens != chunk:
            why.append("the most this budget holds")
    else:
        start = attempt(first)
        if start is None:  # not even the default context: the model alone may still fit at a shorter one
            shortest = attempt_auto(replace(first, context_tokens=min(KV_BLOCK_TOKENS, longest)))
            if shortest is None:
                _refuse(spec, topology, first, objective, stages, tried=[])
            assert shortest is not None
            first, start = shortest
        k = len(start.stages)
        context = _longest(lambda c: attempt(replace(first, context_tokens=c), k) is not None,
                           first.context_tokens, longest)
        profile = replace(first, context_tokens=context)
        found = attempt(profile, k)
        assert found is not None
        cert = found
        why.append("the model's longest context" if context == longest else "the longest context that fits")
    if request.batch is None:  # auto: as many sequences as fit without more devices
        for count in AUTO_BATCHES:
            if count <= profile.batch:
                break
            widened = attempt_auto(request.with_batch(profile, count), len(cert.stages))
            if widened is not None:
                profile, cert = widened
                break
    if request.prefix_snapshots is None and profile.prefix_snapshots < profile.batch:
        why.append(f"prefix snapshots for {profile.prefix_snapshots} of the {profile.batch} sequences (what they leave)")
    return FittedProfile(profile, cert, describe(profile, why))


def describe(profile: Profile, why: list[str]) -> str:
    """``32,768 positions, 1 sequence, prefill chunks of 256: the most this budget holds``."""
    seqs = f"{profile.batch} sequence{'s' if profile.batch != 1 else ''}"
    kv = f", {profile.kv_storage} KV" if profile.kv_storage == "fp8" else ""
    text = f"{profile.context_tokens:,} positions, {seqs}, prefill chunks of {profile.prefill_chunk_tokens}{kv}"
    return text + (f": {', '.join(why)}" if why else "")


def _smaller_chunks(chunk: int) -> list[int]:
    out = []
    while chunk // 2 >= MIN_TRADED_CHUNK_TOKENS:
        chunk //= 2
        out.append(chunk)
    return out


def _longest(fits: Callable[[int], bool], lo: int, hi: int) -> int:
    """The largest context in ``[lo, hi]`` that fits (``lo`` does), in whole KV blocks unless ``hi``
    itself fits; fitting only gets harder as the context grows."""
    if fits(hi):
        return hi
    lo_blocks, hi_blocks = lo // KV_BLOCK_TOKENS, hi // KV_BLOCK_TOKENS  # lo fits (or is below a block)
    while hi_blocks - lo_blocks > 1:  # lo_blocks fits (or is lo's floor), hi_blocks does not
        mid = (lo_blocks + hi_blocks) // 2
        if fits(mid * KV_BLOCK_TOKENS):
            lo_blocks = mid
        else:
            hi_blocks = mid
    return max(lo, lo_blocks * KV_BLOCK_TOKENS)


def _refuse(spec: ModelSpec, topology: Topology, first: Profile, objective: str, stages: int | None,
            tried: list[int]) -> None:
    """Raise :class:`DoesNotFit` (or, for a fixed stage count, :class:`PlacementError`) with the first
    attempt's reason, and the chunks also tried."""
    also = f" (also tried prefill chunks of {', '.join(map(str, tried))})" if tried else ""
    try:
        cert = plan(spec, topology, first, objective=objective, stages=stages)
    except PlacementError as exc:
        raise PlacementError(f"{exc}{also}") from None
    raise DoesNotFit((cert.reasons[0] if cert.reasons else f"{spec.name} does not fit") + also)
