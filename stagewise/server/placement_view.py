"""The placement as the status endpoint shows it: devices, links, stages planned beside measured.

Read once per loaded model from what loading already holds — the certified plan
(``LoadedModel.placement_json``), the topology it was planned on, and each stage's ledger and
tensors — never recomputed. JSON-ready; the byte figures keep the plan's names (``*_bytes``).
"""

from __future__ import annotations

import itertools
from typing import Any

from stagewise.engine.loaded_model import LoadedModel
from stagewise.hardware.topology import Topology
from stagewise.runtime.remote_stage import RemoteStage
from stagewise.runtime.stage import ChargeCheck, Stage


def _measured(stage: Stage, check: ChargeCheck) -> dict[str, int | None]:
    """Bytes counted from the stage's real tensors, and the load check's peak (workspace: the peak above
    the resident tensors; None where not measured); a worker's stage reports its total only."""
    if isinstance(stage, RemoteStage):
        return {"weights_bytes": None, "state_bytes": None, "workspace_bytes": None, "peak_bytes": None,
                "total_bytes": stage.measured_bytes()}
    return {"weights_bytes": check.measured_weights_bytes, "state_bytes": check.measured_state_bytes,
            "workspace_bytes": check.measured_workspace_bytes, "peak_bytes": check.measured_peak_bytes,
            "total_bytes": check.measured_bytes}


def _devices(topology: Topology, planned: dict[str, int]) -> list[dict[str, Any]]:
    return [{"id": d.id, "name": d.name, "kind": d.kind, "host": d.host, "torch_device": d.torch_device,
             "memory_bytes": d.memory_bytes, "budget_bytes": d.budget_bytes,
             "free_bytes": d.free_bytes,  # free when the devices were discovered (None: not known)
             "planned_bytes": planned.get(d.id, 0),  # the plan's charges of the stages it holds
             "headroom_bytes": d.budget_bytes - planned.get(d.id, 0)} for d in topology.devices]


def _links(topology: Topology, stage_devices: list[str]) -> list[dict[str, Any]]:
    """Every pair of the stages' devices; ``boundary``: a handoff crosses it (consecutive stages)."""
    boundaries = set(itertools.pairwise(stage_devices))
    out = []
    for a, b in itertools.combinations(stage_devices, 2):
        link = topology.link(a, b)
        out.append({"between": [a, b], "kind": link.kind, "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
                    "latency_s": link.latency_s, "measured": link.measured,
                    "boundary": (a, b) in boundaries or (b, a) in boundaries})
    return out


def placement_view(model: LoadedModel) -> dict[str, Any]:
    """The placement ``model`` runs under (see docs/serving.md, "Status")."""
    plan = model.placement_json
    pipeline = model.pipeline
    stages = []
    planned_by_device: dict[str, int] = {}
    checks = model.charge_checks()
    for planned, stage, check in zip(plan["stages"], pipeline.stages, checks, strict=True):
        start, end = planned["blocks"]
        planned_by_device[planned["device"]] = planned_by_device.get(planned["device"], 0) + \
            planned["charge"]["total_bytes"]
        table = stage.block_table
        stages.append({"index": stage.spec.index, "device": planned["device"], "torch_device": stage.spec.torch_device,
                       "blocks": [start, end], "entry": planned["entry"], "exit": planned["exit"],
                       "budget_bytes": planned["budget_bytes"],
                       "planned": dict(planned["charge"]),  # weights / state (KV + recurrent) / workspace / reserve
                       "ledger": dict(stage.ledger.charged),  # what the stage charged before allocating
                       "measured": _measured(stage, check),
                       "kv_blocks": table.num_blocks if table is not None else None})
    topology = model.topology
    return {
        "fingerprint": plan["fingerprint"],
        "outcome": plan["outcome"],
        "objective": plan["objective"],
        "summary": model.placement_summary,
        "architecture": model.config.architecture,
        "predicted": plan["predicted"],
        "max_context": model.max_context,
        "sequence_slots": pipeline.rows,
        "profile": model.profile.to_dict(),  # the one profile the placement was certified for
        "choice": model.choice,  # "32,768 positions, 1 sequence, prefill chunks of 512: …"
        "devices": _devices(topology, planned_by_device) if topology is not None else [],
        "links": _links(topology, [s["device"] for s in stages]) if topology is not None else [],
        "stages": stages,
    }
