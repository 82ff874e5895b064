"""Gated DeltaNet over packed steps with indexed state entries: the causal conv and the chunked delta rule.

The torch reference path against today's per-sequence functions (float32, bit for bit where the
arithmetic is the same), the Triton kernels against the reference (Triton's interpreter on CPU, or a
GPU), and the properties the prefix cache relies on, on both paths: a prompt split at 64-token chunk
boundaries over several calls, or resumed from a snapshot, gives bit for bit what one call gives;
entries no segment names are never touched. The decode kernels read and write entries by index.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch.nn import functional as F

from stagewise.models.layers.causal_conv import causal_conv_step_reference, packed_causal_conv_reference
from stagewise.models.layers.decay_gates import DecayGates
from stagewise.models.layers.delta_rule import (
    chunked_gated_delta_rule,
    packed_chunked_gated_delta_rule_reference,
    packed_recurrent_step,
    recurrent_gated_delta_rule,
)
from stagewise.models.layers.packed_segments import PackedSegments

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNELS = DEVICE == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
needs_kernels = pytest.mark.skipif(not KERNELS, reason="Triton kernels need a GPU or TRITON_INTERPRET=1")
K_HEADS, V_HEADS, DK, DV, KERNEL = 2, 4, 16, 16, 4
CHANNELS = 2 * K_HEADS * DK + V_HEADS * DV
ENTRIES = 16
LENGTHS = (1, 5, 64, 65, 130)
READ = (0, 3, 0, 5, 7)  # the zero entry and populated ones
WRITE = (9, 2, 12, 4, 11)  # not in row order
UNNAMED = (1, 6, 8, 10, 13, 14, 15)  # populated entries no segment names
TOL = {"atol": 2e-5, "rtol": 2e-5}


@dataclass
class Step:
    """One packed step's rule inputs ``(N, ...)`` (q, k, v and the gates' inputs ``b``, ``a``; per head
    ``a_log``, ``dt_bias``) and a pool (entry 0 zero, the others random)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    b: torch.Tensor
    a: torch.Tensor
    a_log: torch.Tensor
    dt_bias: torch.Tensor
    pool: torch.Tensor

    @property
    def gates(self) -> DecayGates:
        return DecayGates(self.b, self.a, self.a_log, self.dt_bias)

    def rows(self, lo: int, hi: int) -> tuple[torch.Tensor, ...]:
        """q, k, v, g, beta of tokens ``lo .. hi - 1`` (the gates evaluated), for the per-sequence rules."""
        beta, g = self.gates.rows(lo, hi).values()
        return self.q[lo:hi], self.k[lo:hi], self.v[lo:hi], g, beta

    def select(self, index: torch.Tensor) -> Step:
        """The step of tokens ``index`` (in that order), the same pool."""
        q, k, v, b, a = (x[index] for x in (self.q, self.k, self.v, self.b, self.a))
        return Step(q, k, v, b, a, self.a_log, self.dt_bias, self.pool)

    def as_float(self) -> Step:
        q, k, v, b, a = (x.float() for x in (self.q, self.k, self.v, self.b, self.a))
        return Step(q, k, v, b, a, self.a_log, self.dt_bias, self.pool)


def _step(tokens: int, seed: int, dtype: torch.dtype = torch.float32, dk: int = DK, dv: int = DV) -> Step:
    gen = torch.Generator().manual_seed(seed)
    # q, k, v as strided views of one conv output row, as the layer gives them
    mixed = torch.randn(tokens, 2 * K_HEADS * dk + V_HEADS * dv, generator=gen)
    q, k, v = mixed.to(DEVICE, dtype).split([K_HEADS * dk, K_HEADS * dk, V_HEADS * dv], dim=-1)
    # the gates' inputs, as the layer's projections give them: strided views of one (N, 2 Hv) row
    ba = (torch.randn(tokens, 2 * V_HEADS, generator=gen) * 2).to(DEVICE, dtype)
    a_log = (torch.rand(V_HEADS, generator=gen) * 2 - 1.5).to(DEVICE)
    dt_bias = torch.randn(V_HEADS, generator=gen).to(DEVICE)
    pool = torch.randn(ENTRIES, V_HEADS, dk, dv, generator=gen) * 0.3
    pool[0] = 0
    return Step(q.view(tokens, K_HEADS, dk), k.view(tokens, K_HEADS, dk), v.view(tokens, V_HEADS, dv),
                ba[:, :V_HEADS], ba[:, V_HEADS:], a_log, dt_bias, pool.to(DEVICE))


def _segments(lengths: tuple[int, ...], read: tuple[int, ...], write: tuple[int, ...], first_token: int = 0,
              snap: tuple[int, ...] | None = None, snap_at: tuple[int, ...] | None = None) -> PackedSegments:
    return PackedSegments.build(lengths, read, write, torch.device(DEVICE), snap, snap_at, first_token)


def _reference_rule(step: Step, pool: torch.Tensor, segments: PackedSegments) -> torch.Tensor:
    return packed_chunked_gated_delta_rule_reference(step.q, step.k, step.v, step.gates, pool, segments)


def _triton_rule(step: Step, pool: torch.Tensor, segments: PackedSegments) -> torch.Tensor:
    from stagewise.kernels.deltanet_packed_triton import packed_gated_delta_rule_triton

    return packed_gated_delta_rule_triton(step.q, step.k, step.v, step.gates, pool, segments)


RULES = [pytest.param(_reference_rule, id="reference"), pytest.param(_triton_rule, id="triton", marks=needs_kernels)]
Rule = Callable[[Step, torch.Tensor, PackedSegments], torch.Tensor]


def test_reference_rule_equals_the_per_sequence_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every segment (1 .. 130 tokens, from the zero entry or a populated one) gives what
    ``chunked_gated_delta_rule`` gives it alone (bit for bit on CPU); entries no segment names keep their bits."""
    monkeypatch.setenv("STAGEWISE_KERNELS", "torch")  # today's function on its torch path too
    same = torch.equal if DEVICE == "cpu" else lambda a, b: torch.allclose(a, b, **TOL)
    step = _step(sum(LENGTHS), seed=0)
    pool = step.pool.clone()
    out = _reference_rule(step, pool, _segments(LENGTHS, READ, WRITE))
    lo = 0
    for n, src, dst in zip(LENGTHS, READ, WRITE, strict=True):
        q, k, v, g, beta = (x[None] for x in step.rows(lo, lo + n))
        want_out, want_state = chunked_gated_delta_rule(q, k, v, g, beta, step.pool[src][None])
        assert same(out[lo : lo + n], want_out[0]), f"{n} tokens"
        assert same(pool[dst], want_state[0]), f"{n} tokens"
        lo += n
    for e in (0, *UNNAMED, *READ):
        assert torch.equal(pool[e], step.pool[e])


@needs_kernels
def test_the_layer_functions_take_the_triton_path_where_use_triton_says() -> None:
    from stagewise.kernels.triton_launch import kernels_on_host
    from stagewise.models.layers.causal_conv import packed_causal_conv
    from stagewise.models.layers.delta_rule import packed_chunked_gated_delta_rule

    step = _step(70, seed=12)
    x, weight, conv_pool = _conv_inputs(70, seed=13)
    segments = _segments((5, 65), (3, 0), (9, 10))
    pools = [(step.pool.clone(), conv_pool.clone()) for _ in range(3)]
    rule = [_reference_rule(step, pools[0][0], segments), _triton_rule(step, pools[1][0], segments)]
    conv = [_reference_conv(x, weight, pools[0][1], segments), _triton_conv(x, weight, pools[1][1], segments)]
    with kernels_on_host():
        got_rule = packed_chunked_gated_delta_rule(step.q, step.k, step.v, step.gates, pools[2][0], segments)
        got_conv = packed_causal_conv(x, weight, pools[2][1], segments)
    assert torch.equal(got_rule, rule[1]) and torch.equal(got_conv, conv[1])  # the kernels' bits
    assert not torch.equal(rule[0], rule[1]), "the paths differ in rounding, so the check above means something"


@needs_kernels
@pytest.mark.parametrize(("dk", "dv", "block_v"), [(16, 24, 16), (16, 24, 32), (64, 32, 16)])  # masked / whole tiles
def test_triton_rule_matches_the_reference(dk: int, dv: int, block_v: int) -> None:
    from stagewise.kernels.deltanet_packed_triton import packed_gated_delta_rule_triton

    step = _step(3 + sum(LENGTHS), seed=1, dk=dk, dv=dv)  # 3 tokens before the first segment (decoding rows)
    segments = _segments(LENGTHS, READ, WRITE, first_token=3, snap=(0, 0, 1, 0, 6), snap_at=(0, 0, 64, 0, 128))
    want_pool, got_pool = step.pool.clone(), step.pool.clone()
    want = _reference_rule(step, want_pool, segments)
    got = torch.full_like(want, 7.0)
    packed_gated_delta_rule_triton(step.q, step.k, step.v, step.gates, got_pool, segments, out=got,
                                   block_v=block_v)
    torch.testing.assert_close(got[3:], want[3:], **TOL)
    assert torch.equal(got[:3], torch.full_like(got[:3], 7.0)), "tokens outside every segment are not written"
    torch.testing.assert_close(got_pool, want_pool, **TOL)
    for e in (0, 8, 10, 13, 14, 15, *READ):  # entries 1 and 6 hold snapshots now
        assert torch.equal(got_pool[e], step.pool[e])


@needs_kernels
def test_triton_rule_computes_the_gates_as_decay_gates_values() -> None:
    """The kernels evaluate the gates where they read them: at saturated sigmoids (beta 0 and 1), past
    softplus' linear threshold (a + dt_bias > 20), at 0 and below, they give what the reference gives
    from :meth:`DecayGates.values`."""
    from stagewise.kernels.deltanet_packed_triton import packed_gated_delta_rule_triton

    step = _step(70, seed=21)
    edges = torch.tensor([-110.0, -20.5, -1.0, 0.0, 19.5, 20.0, 20.5, 30.0], device=DEVICE)
    index = torch.arange(70 * V_HEADS, device=DEVICE) % edges.numel()
    step.b.copy_(edges[index].view(70, V_HEADS))
    step.a.copy_(edges[(index + 3) % edges.numel()].view(70, V_HEADS) - step.dt_bias)
    beta, g = step.gates.values()
    assert bool((beta == 0).any()) and bool((beta == 1).any())  # the edges are reached
    assert bool((step.a + step.dt_bias > 20).any()) and bool((g < -5).any())
    segments = _segments((5, 65), (3, 0), (9, 10))
    want_pool, got_pool = step.pool.clone(), step.pool.clone()
    want = _reference_rule(step, want_pool, segments)
    got = packed_gated_delta_rule_triton(step.q, step.k, step.v, step.gates, got_pool, segments)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(got_pool, want_pool, **TOL)


@pytest.mark.parametrize("rule", RULES)
def test_rule_split_at_chunks_and_resumed_from_snapshots_is_bit_identical(rule: Rule) -> None:
    """A 200-token prompt in one call (snapshots at 64 and 128) = in pieces of 64, 64, 72 over three
    calls (other segments beside it) = resumed from either snapshot."""
    step = _step(200 + 70, seed=2)
    pool = step.pool.clone()
    # the prompt beside a 70-token segment of another sequence
    whole = rule(step, pool, _segments((200, 70), (3, 0), (9, 10), snap=(1, 0), snap_at=(64, 0)))
    again = step.pool.clone()
    rule(step, again, _segments((200,), (3,), (9,), snap=(6,), snap_at=(128,)))
    snapshots = {64: pool[1].clone(), 128: again[6].clone()}

    split_pool = step.pool.clone()
    pieces, src = [], 3
    for lo, hi, dst, beside in ((0, 64, 11, 70), (64, 128, 12, 5), (128, 200, 13, 1)):
        # the piece first, then a segment of another sequence (from the step's last tokens)
        sub = step.select(torch.cat([torch.arange(lo, hi), torch.arange(200, 200 + beside)]).to(DEVICE))
        pieces.append(rule(sub, split_pool, _segments((hi - lo, beside), (src, 0), (dst, 14)))[: hi - lo])
        src = dst
    assert torch.equal(torch.cat(pieces), whole[:200])
    assert torch.equal(split_pool[13], pool[9])
    assert torch.equal(split_pool[11], snapshots[64]) and torch.equal(split_pool[12], snapshots[128])

    for at, entry in ((64, 1), (128, 6)):
        resumed_pool = step.pool.clone()
        resumed_pool[entry] = snapshots[at]
        sub = step.select(torch.arange(at, 200, device=DEVICE))
        resumed = rule(sub, resumed_pool, _segments((200 - at,), (entry,), (15,)))
        assert torch.equal(resumed, whole[at:200]), f"resumed at {at}"
        assert torch.equal(resumed_pool[15], pool[9]), f"resumed at {at}"


# --- the causal conv ---


def _conv_inputs(tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, CHANNELS, generator=gen)
    weight = torch.randn(CHANNELS, 1, KERNEL, generator=gen)
    pool = torch.randn(ENTRIES, CHANNELS, KERNEL, generator=gen)
    pool[0] = 0
    return x.to(DEVICE), weight.to(DEVICE), pool.to(DEVICE)


def _today_conv(x: torch.Tensor, weight: torch.Tensor, window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``GatedDeltaNet.forward``'s conv of one sequence ``x`` ``(T, C)`` after ``window`` ``(C, K)``."""
    full = torch.cat([window[None], x.T[None]], dim=-1)  # (1, C, K + T)
    mixed = F.conv1d(full[..., 1:].to(weight.dtype), weight, groups=x.shape[1])
    return F.silu(mixed).to(x.dtype)[0].T, full[0, :, -window.shape[-1] :]


# NOTE: CHANNELS is a multiple of 32, so CPU SiLU takes its vector path for every element whatever the
# tensor's length (its scalar tail rounds differently): the per-chunk reference equals today's conv bit for bit
CONV_LENGTHS = (1, 2, 5, 64, 65, 130)  # 1 and 2: shorter than the kernel, older inputs from the window
CONV_READ = (3, 0, 5, 0, 7, 8)
CONV_WRITE = (9, 2, 12, 4, 11, 1)
CONV_UNNAMED = (6, 10, 13, 14, 15)


def test_reference_conv_equals_the_per_sequence_conv() -> None:
    x, weight, pool = _conv_inputs(sum(CONV_LENGTHS), seed=3)
    got_pool = pool.clone()
    out = packed_causal_conv_reference(x, weight, got_pool, _segments(CONV_LENGTHS, CONV_READ, CONV_WRITE))
    lo = 0
    for n, src, dst in zip(CONV_LENGTHS, CONV_READ, CONV_WRITE, strict=True):
        want, window = _today_conv(x[lo : lo + n], weight, pool[src])
        assert torch.equal(out[lo : lo + n], want), f"{n} tokens"
        assert torch.equal(got_pool[dst], window)
        lo += n
    for e in (0, *CONV_UNNAMED, *CONV_READ):
        assert torch.equal(got_pool[e], pool[e])


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_conv_matches_the_reference(dtype: torch.dtype) -> None:
    from stagewise.kernels.causal_conv_triton import packed_causal_conv_triton

    x, weight, pool = (t.to(dtype) for t in _conv_inputs(2 + sum(CONV_LENGTHS), seed=4))
    segments = _segments(CONV_LENGTHS, CONV_READ, CONV_WRITE, first_token=2,
                         snap=(0, 0, 0, 6, 13, 10), snap_at=(0, 0, 0, 64, 64, 128))
    want_pool, got_pool = pool.clone(), pool.clone()
    want = packed_causal_conv_reference(x, weight, want_pool, segments)
    got = torch.full_like(x, 7.0)
    packed_causal_conv_triton(x, weight, got_pool, segments, out=got)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(got[2:], want[2:], **tol)
    assert torch.equal(got[:2], torch.full_like(got[:2], 7.0))
    assert torch.equal(got_pool, want_pool), "windows are copies of inputs"


def _reference_conv(x: torch.Tensor, weight: torch.Tensor, pool: torch.Tensor, segments: PackedSegments) -> torch.Tensor:
    return packed_causal_conv_reference(x, weight, pool, segments)


def _triton_conv(x: torch.Tensor, weight: torch.Tensor, pool: torch.Tensor, segments: PackedSegments) -> torch.Tensor:
    from stagewise.kernels.causal_conv_triton import packed_causal_conv_triton

    return packed_causal_conv_triton(x, weight, pool, segments)


CONVS = [pytest.param(_reference_conv, id="reference"), pytest.param(_triton_conv, id="triton", marks=needs_kernels)]


@pytest.mark.parametrize("conv", CONVS)
def test_conv_split_at_chunks_and_resumed_from_snapshots_is_bit_identical(
        conv: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, PackedSegments], torch.Tensor]) -> None:
    x, weight, pool = _conv_inputs(200 + 9, seed=5)
    whole_pool = pool.clone()
    whole = conv(x, weight, whole_pool, _segments((200, 9), (3, 0), (9, 10), snap=(1, 0), snap_at=(128, 0)))
    split_pool = pool.clone()
    pieces, src = [], 3
    for lo, hi, dst in ((0, 64, 11), (64, 128, 12), (128, 200, 13)):
        rows = torch.cat([x[lo:hi], x[200:]])  # the piece, then another sequence's 9 tokens
        pieces.append(conv(rows, weight, split_pool, _segments((hi - lo, 9), (src, 0), (dst, 14)))[: hi - lo])
        src = dst
    assert torch.equal(torch.cat(pieces), whole[:200])
    assert torch.equal(split_pool[13], whole_pool[9])
    assert torch.equal(split_pool[12], whole_pool[1]), "the snapshot is the window after 128 tokens"
    resumed_pool = pool.clone()
    resumed_pool[4] = whole_pool[1]
    resumed = conv(x[128:200], weight, resumed_pool, _segments((72,), (4,), (15,)))
    assert torch.equal(resumed, whole[128:200])
    assert torch.equal(resumed_pool[15], whole_pool[9])


# --- decoding rows ---


def test_packed_recurrent_step_equals_the_recurrent_rule() -> None:
    step = _step(3, seed=6)
    pool = step.pool.clone()
    read, write = (torch.tensor(e, dtype=torch.int32, device=DEVICE) for e in ((5, 0, 2), (7, 1, 3)))
    out = packed_recurrent_step(step.q, step.k, step.v, step.gates, pool, read, write)
    q, k, v, g, beta = step.rows(0, 3)
    want_out, want_state = recurrent_gated_delta_rule(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None],
                                                      step.pool[[5, 0, 2]])
    assert torch.equal(out, want_out[:, 0]) and torch.equal(pool[[7, 1, 3]], want_state)
    untouched = [e for e in range(ENTRIES) if e not in (7, 1, 3)]
    assert torch.equal(pool[untouched], step.pool[untouched])


def test_causal_conv_step_continues_the_window() -> None:
    x, weight, pool = _conv_inputs(3, seed=7)
    got_pool = pool.clone()
    read, write = (torch.tensor(e, dtype=torch.int32, device=DEVICE) for e in ((5, 0, 2), (7, 1, 3)))
    out = causal_conv_step_reference(x, weight, got_pool, read, write)
    for b, (src, dst) in enumerate(zip((5, 0, 2), (7, 1, 3), strict=True)):
        want, window = _today_conv(x[b : b + 1], weight, pool[src])
        assert torch.equal(out[b : b + 1], want)
        assert torch.equal(got_pool[dst], window)


@needs_kernels
def test_indexed_decode_kernels_equal_the_contiguous_rows_and_the_reference() -> None:
    """conv_step / delta_step with index tensors (entries scattered; the columns of a ``[read, write]``
    table) = with ints (consecutive entries) = the torch reference."""
    from stagewise.kernels.deltanet_decode_triton import conv_step, delta_step

    batch = 3
    x, weight, conv_pool = _conv_inputs(batch, seed=8)
    step = _step(batch, seed=9)
    gen = torch.Generator().manual_seed(10)
    b, a = (torch.randn(batch, V_HEADS, generator=gen).to(DEVICE) for _ in range(2))
    a_log, dt_bias = (torch.randn(V_HEADS, generator=gen).to(DEVICE) for _ in range(2))
    table = torch.tensor([[5, 7], [0, 1], [9, 3]], dtype=torch.int32, device=DEVICE)  # (rows, [read, write])
    read, write = table[:, 0], table[:, 1]  # strided views, as a stage's slot table gives them

    indexed_conv, indexed_pool = conv_pool.clone(), step.pool.clone()
    mixed = conv_step(x, weight, indexed_conv, read, write)
    rows_conv = conv_pool.clone()
    rows_conv[10:13] = conv_pool[[5, 0, 9]]
    assert torch.equal(conv_step(x, weight, rows_conv, 10, 13), mixed)
    assert torch.equal(rows_conv[13:16], indexed_conv[[7, 1, 3]])
    ref_conv = conv_pool.clone()
    torch.testing.assert_close(mixed, causal_conv_step_reference(x, weight, ref_conv, read, write), atol=1e-6, rtol=1e-6)
    assert torch.equal(indexed_conv, ref_conv)

    out = delta_step(mixed, b, a, a_log, dt_bias, indexed_pool, read, write, K_HEADS, DK)
    rows_pool = step.pool.clone()
    rows_pool[10:13] = step.pool[[5, 0, 9]]
    assert torch.equal(delta_step(mixed, b, a, a_log, dt_bias, rows_pool, 10, 13, K_HEADS, DK), out)
    assert torch.equal(rows_pool[13:16], indexed_pool[[7, 1, 3]])
    q, k, v = mixed.split([K_HEADS * DK, K_HEADS * DK, V_HEADS * DV], dim=-1)
    ref_pool = step.pool.clone()
    want = packed_recurrent_step(q.reshape(batch, K_HEADS, DK), k.reshape(batch, K_HEADS, DK),
                                 v.reshape(batch, V_HEADS, DV), DecayGates(b, a, a_log, dt_bias), ref_pool, read, write)
    torch.testing.assert_close(out, want, **TOL)
    torch.testing.assert_close(indexed_pool, ref_pool, **TOL)


# --- the segment table ---


def test_segments_table_and_its_rules() -> None:
    segments = _segments((1, 130, 64), (0, 3, 0), (4, 5, 6), first_token=2, snap=(0, 7, 8), snap_at=(0, 128, 64))
    assert segments.offsets == (2, 3, 133, 197) and segments.lengths == (1, 130, 64)
    assert segments.chunk_count == 5 and segments.longest == 130
    assert segments.chunks.tolist() == [[0, 2], [1, 3], [1, 67], [1, 131], [2, 133]]
    assert segments.chunk_offsets.tolist() == [0, 1, 4, 5]
    for bad in [dict(write=(4, 0, 6)),  # the zero entry is never written
                dict(write=(4, 3, 6)),  # an entry both read and written
                dict(write=(4, 4, 6)),  # one entry written twice
                dict(snap=(0, 4, 8)),  # a snapshot onto a written entry
                dict(snap_at=(0, 100, 64)),  # not a chunk boundary
                dict(snap_at=(0, 192, 64))]:  # past the segment's end
        args = dict(lengths=(1, 130, 64), read=(0, 3, 0), write=(4, 5, 6), snap=(0, 7, 8), snap_at=(0, 128, 64))
        args.update(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            PackedSegments.build(device=torch.device(DEVICE), **args)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        PackedSegments.build((0, 5), (0, 0), (1, 2), torch.device(DEVICE))  # an empty segment
    empty = _segments((), (), ())
    assert empty.count == 0 and empty.chunk_count == 0


# --- GPU: the serving dtype at the model's head sizes ---


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_rule_on_the_gpu_near_the_float32_reference_and_bit_identical_when_split() -> None:
    from stagewise.kernels.deltanet_packed_triton import packed_gated_delta_rule_triton

    step = _step(200 + 70, seed=11, dtype=torch.bfloat16, dk=128, dv=128)
    exact = step.as_float()
    segments = _segments((200, 70), (3, 0), (9, 10), snap=(1, 0), snap_at=(128, 0))
    want_pool, got_pool = step.pool.clone(), step.pool.clone()
    want = _reference_rule(exact, want_pool, segments)
    got = packed_gated_delta_rule_triton(step.q, step.k, step.v, step.gates, got_pool, segments)
    scale = want.abs().max()
    assert float((got.float() - want).abs().max()) <= 2e-2 * float(scale)
    assert float((got_pool - want_pool).abs().max()) <= 2e-2 * float(want_pool.abs().max())
    resumed_pool = step.pool.clone()
    resumed_pool[4] = got_pool[1]
    sub = step.select(torch.arange(128, 200, device=DEVICE))
    resumed = packed_gated_delta_rule_triton(sub.q, sub.k, sub.v, sub.gates, resumed_pool,
                                             _segments((72,), (4,), (15,)))
    assert torch.equal(resumed, got[128:200]) and torch.equal(resumed_pool[15], got_pool[9])
