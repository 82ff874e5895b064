"""Random specs and topologies for the planner tests, and an independent brute force."""

from __future__ import annotations

import itertools
import random

from stagewise.hardware.device_info import DeviceInfo
from stagewise.hardware.link import Link
from stagewise.hardware.topology import Topology
from stagewise.placement.cost_model import (
    LINEAR_ATTENTION_REFERENCE_STATE_VALUES,
    block_prefill_s_per_token,
    chunk_read_bytes,
    handoff_ps,
    objective_key,
    pipelined_prefill_s_per_token,
    stage_decode_ps,
)
from stagewise.placement.cut_search import use_ppm
from stagewise.spec.block_spec import BlockSpec, EndSpec
from stagewise.spec.charge import stage_charge
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.profile import Profile

MB = 10**6
PROFILE = Profile(context_tokens=256, batch=1, prefill_chunk_tokens=64)


def random_spec(rng: random.Random, n_blocks: int, tied: bool = False) -> ModelSpec:
    blocks = []
    for i in range(n_blocks):
        linear = rng.random() < 0.5
        w = rng.randint(50, 400) * MB
        blocks.append(
            BlockSpec(
                index=i,
                mixer="linear_attention" if linear else "attention",
                moe=False,
                weight_bytes=w,
                read_bytes_per_token=w // rng.randint(1, 4),
                flops_per_token=rng.randint(1, 50) * 10**6,
                kv_values_per_token=0 if linear else rng.choice([256, 1024, 2048]),
                conv_state_values=rng.randint(1, 5) * 1000 if linear else 0,
                recurrent_state_values=rng.randint(1, 5) * 10000 if linear else 0,
                attention_flops_per_position=0 if linear else 4096,
                activation_values_per_token=rng.randint(1000, 20000),
                score_values_per_position=0 if linear else rng.choice([8, 16]),
            )
        )
    emb = rng.randint(50, 500) * MB
    entry = EndSpec(emb, emb // 1000, 0)
    exit_ = EndSpec(emb + 4096, emb, 2 * emb, shared_bytes=emb if tied else 0, logits_values_per_token=32000)
    return ModelSpec("rand", "test", "q8_0", 1024, 32000, tuple(blocks), entry, exit_)


def random_topology(rng: random.Random, n_dev: int, spec: ModelSpec) -> Topology:
    total = spec.weight_bytes
    devices = []
    for i in range(n_dev):
        budget = int(total * rng.choice([0.2, 0.3, 0.35, 0.45, 0.55, 0.7, 1.1]) * rng.uniform(0.8, 1.2))
        devices.append(
            DeviceInfo(
                id=f"sim:{i}",
                host=rng.choice(["h0", "h0", "h1"]),
                kind="sim",
                name="sim",
                memory_bytes=budget + 1,
                budget_bytes=budget,
                memory_bandwidth_bytes_per_s=rng.choice([300e9, 900e9, 2000e9]),
                matmul_flops_per_s=rng.choice([20e12, 70e12]),
            )
        )
    links = []
    for a, b in itertools.combinations(range(n_dev), 2):
        if devices[a].host == devices[b].host and rng.random() < 0.4:
            kind = rng.choice(["nvlink", "pcie-p2p"])
            links.append(Link(f"sim:{a}", f"sim:{b}", kind, rng.choice([20e9, 100e9]), rng.choice([5e-6, 2e-5]), True))
    return Topology(tuple(devices), tuple(links))


def evaluate(spec: ModelSpec, topo: Topology, profile: Profile, objective: str, order, bounds) -> tuple | None:
    """Objective key of a concrete placement, from first principles; None if illegal."""
    k = len(order)
    stage_ps, hand, use = [], [], []
    for j, dev_id in enumerate(order):
        d = topo.device(dev_id)
        a, b = bounds[j], bounds[j + 1]
        charge = stage_charge(spec, profile, a, b, j == 0, j == k - 1)
        if charge.total_bytes > d.budget_bytes:
            return None
        use.append(use_ppm(charge.total_bytes, d.budget_bytes))
        stage_ps.append(stage_decode_ps(spec, profile, d, a, b, j == 0, j == k - 1))
        hand.append(handoff_ps(spec, profile, topo.link(dev_id, order[j + 1])) if j < k - 1 else 0)
    return objective_key(objective, stage_ps, hand, use)


def brute_force(spec: ModelSpec, topo: Topology, profile: Profile, objective: str) -> tuple[int, tuple] | None:
    """(fewest stage count, best key) by trying every order and every cut."""
    n = spec.num_blocks
    for k in range(1, min(len(topo.devices), n) + 1):
        best = None
        for order in itertools.permutations(topo.ids, k):
            for cuts in itertools.combinations(range(1, n), k - 1):
                key = evaluate(spec, topo, profile, objective, order, [0, *cuts, n])
                if key is not None and (best is None or key < best):
                    best = key
        if best is not None:
            return k, best
    return None


def planned_key(cert, spec: ModelSpec, topo: Topology, profile: Profile, objective: str) -> tuple[int, tuple]:
    order = [s.placement.device_id for s in cert.stages]
    bounds = [s.placement.start for s in cert.stages] + [spec.num_blocks]
    key = evaluate(spec, topo, profile, objective, order, bounds)
    assert key is not None
    return len(order), key


def test_prefill_chunk_reads_the_experts_its_tokens_route_to() -> None:
    dense = BlockSpec(index=0, mixer="attention", moe=False, weight_bytes=1000, read_bytes_per_token=1000,
                      flops_per_token=1)
    assert chunk_read_bytes(dense, 512) == 1000
    # 100 bytes shared + 8 experts x 100 bytes, top-2: a token reads 300, a long chunk all 900
    moe = BlockSpec(index=0, mixer="attention", moe=True, weight_bytes=900, read_bytes_per_token=300,
                    flops_per_token=1, routed_experts=8, experts_per_token=2)
    assert chunk_read_bytes(moe, 1) == 300  # one token: its own two experts
    assert abs(chunk_read_bytes(moe, 2) - (100 + 8 * (1 - 0.75**2) * 100)) < 1e-9
    assert abs(chunk_read_bytes(moe, 512) - 900) < 1e-6


def test_prefill_chunks_flow_through_the_stages() -> None:
    assert pipelined_prefill_s_per_token([1.0], 0.0, chunks=4) == 1.0
    assert pipelined_prefill_s_per_token([1.0, 1.0], 0.0, chunks=1) == 2.0  # one chunk crosses both stages
    # four chunks through stages of 1 and 3 s per token: the first takes 4, each other 3 more
    assert pipelined_prefill_s_per_token([1.0, 3.0], 0.0, chunks=4) == (4.0 + 3 * 3.0) / 4


def test_prefill_scan_grows_with_the_recurrent_state() -> None:
    """A Gated DeltaNet block's scan is charged in proportion to its state: a tiny hybrid is not charged
    Qwen3.6's scan (on a CPU that was 100x its measured prefill time)."""
    device = DeviceInfo(id="cpu:0", host="h0", kind="cpu", name="cpu", memory_bytes=10**9, budget_bytes=10**9,
                        memory_bandwidth_bytes_per_s=40e9, matmul_flops_per_s=0.5e12)

    def seconds(state: int) -> float:
        block = BlockSpec(index=0, mixer="linear_attention", moe=False, weight_bytes=1000, read_bytes_per_token=1000,
                          flops_per_token=1, recurrent_state_values=state)
        return block_prefill_s_per_token(block, PROFILE, device)

    base = seconds(0)
    full = seconds(LINEAR_ATTENTION_REFERENCE_STATE_VALUES) - base
    assert full > 0 and abs((seconds(LINEAR_ATTENTION_REFERENCE_STATE_VALUES // 512) - base) * 512 - full) < 1e-12
