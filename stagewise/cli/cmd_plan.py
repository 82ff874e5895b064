"""``stagewise plan MODEL --devices SPEC``: the certified placement, as a table or JSON.

Exit status: 0 when the model fits, 1 when it does not, 2 for bad input. Also holds the input
handling and rendering that ``assess`` shares.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from stagewise.errors import ConfigError, PlacementError
from stagewise.hardware.device_spec import resolve_device_spec
from stagewise.hardware.reserve_policy import ReservePolicy
from stagewise.hardware.sizes import format_bytes, in_binary_units, uses_binary_units
from stagewise.hardware.topology import Topology
from stagewise.placement import CertifiedPlacement, plan
from stagewise.placement.sequence_capacity import (
    capacity_line,
    capacity_table,
    longest_context,
    longest_line,
    pool_line,
    pool_report,
)
from stagewise.spec.kv_pool import KV_DTYPES
from stagewise.spec.model_source import load_model_spec
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.profile import (
    DEFAULT_CONTEXT_TOKENS,
    DEFAULT_PREFILL_CHUNK_TOKENS,
    Profile,
    default_activation_dtype,
    kernel_path_for,
)
from stagewise.weights.model_path import random_preset


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="GGUF file, model directory (config.json) or config.json")
    p.add_argument("--devices", metavar="SPEC", help="topology JSON, 24GiB,12GiB, 4x24GiB, cpu:2x4GiB, cuda:0@22.76GB…")
    p.add_argument("--reserve", help="reserve kept from free memory: 2GiB, 8%%, cuda=1GiB,cpu=10%%")
    p.add_argument("--context", type=int, default=DEFAULT_CONTEXT_TOKENS, help="context tokens (default 4096)")
    p.add_argument("--batch", type=int, default=1, help="sequences (default 1)")
    p.add_argument("--kv-tokens", type=int, default=None, metavar="N",
                   help="KV pool per stage in positions shared by the sequences (default: batch x context)")
    p.add_argument("--chunk", type=int, default=DEFAULT_PREFILL_CHUNK_TOKENS, help="prefill chunk tokens (default 512)")
    p.add_argument("--kv-dtype", default=None, choices=KV_DTYPES,
                   help="KV cache storage (default: the activation dtype; fp8: float8 e4m3 with per-head scales)")
    p.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                   help="charge no recurrent-state prefix snapshots (hybrids), as `serve --no-prefix-cache` "
                        "holds; default: one per sequence, as `serve` holds")
    p.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                   help="charge eager steps (no CUDA graphs' outputs), as `serve --no-cuda-graphs` runs")
    p.add_argument("--activation-dtype", default=None,
                   help="bf16, f16 or f32 (default: what `run`/`serve` use: f32 on CPU devices, bf16 otherwise)")
    p.add_argument("--format", dest="fmt", help="stored weight format: bf16, f16, f32, q8_0, q4_0, q4_k, q6_k…")
    p.add_argument("--objective", choices=("latency", "throughput"), default="latency")
    p.add_argument("--json", action="store_true", help="print the certified placement as JSON")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("plan", help="plan a certified placement of a model on devices")
    add_common(p)
    p.add_argument("--split", help="blocks per stage, e.g. 21,19")
    p.add_argument("--order", help="devices in stage order, e.g. cuda:1,cuda:0")
    p.add_argument("--max-stages", type=int, help="use at most N stages")
    p.add_argument("--stages", type=int, help="use exactly N stages")
    p.set_defaults(func=run)


def activation_dtype(args: argparse.Namespace, topology: Topology) -> str:
    """The dtype activations (and dense weights) run in: as asked, else the runtime's default."""
    if args.activation_dtype:
        return str(args.activation_dtype)
    return default_activation_dtype({d.kind for d in topology.devices})


def devices_and_profile(args: argparse.Namespace) -> tuple[Topology, Profile]:
    """The ``--devices`` topology and the profile to charge on it (dtype and runtime workspace by device kind)."""
    topology = resolve_device_spec(args.devices, ReservePolicy.parse(args.reserve))
    profile = Profile(args.context, args.batch, args.chunk, activation_dtype(args, topology),
                      kernel_path_for({d.kind for d in topology.devices}), kv_tokens=args.kv_tokens,
                      kv_dtype=args.kv_dtype, cuda_graphs=args.cuda_graphs,
                      prefix_snapshots=args.batch if args.prefix_cache else 0)
    return topology, profile


def inputs(args: argparse.Namespace) -> tuple[ModelSpec, Topology, Profile]:
    """The model's spec, the ``--devices`` topology and the profile to charge on it."""
    if (random := random_preset(args.model)) is not None:
        return _random_inputs(args, *random)
    topology, profile = devices_and_profile(args)
    return load_model_spec(args.model, args.fmt, run_dtype=profile.activation_dtype), topology, profile


def _random_inputs(args: argparse.Namespace, name: str, fmt: str) -> tuple[ModelSpec, Topology, Profile]:
    """``random:PRESET[@TYPE]`` (``name``, ``fmt``): the preset's spec as ``serve``/``run`` would hold it (dense at the run dtype,
    or packed in TYPE), charged on ``--devices``; read without torch."""
    from stagewise.spec.model_config import ModelConfig
    from stagewise.weights.preset_configs import load_hf_config
    from stagewise.weights.source_spec import random_spec

    if args.fmt is not None:
        raise ConfigError(f"{args.model}: a random model's format is part of its name (random:PRESET@q8_0), "
                          "not --format")
    topology, profile = devices_and_profile(args)
    config = ModelConfig.from_hf_dict(load_hf_config(name), source=args.model)
    return random_spec(config, fmt, profile.activation_dtype, args.model), topology, profile


def _ints(text: str | None, flag: str) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise PlacementError(f"{flag}: expected comma-separated integers, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    spec, topology, profile = inputs(args)
    order = [x.strip() for x in args.order.split(",")] if args.order else None
    cert = plan(
        spec,
        topology,
        profile,
        objective=args.objective,
        split=_ints(args.split, "--split"),
        order=order,
        max_stages=args.max_stages,
        stages=args.stages,
    )
    if args.json:
        print(placement_json(cert, spec, profile))
    else:
        render_plan(cert, topology, uses_binary_units(args.devices))
        if cert.fits:
            print(pool_line(profile))
            print(longest_line(longest_context(cert, spec, profile), spec))
            print(capacity_line(capacity_table(cert, spec, profile), profile))
    return 0 if cert.fits else 1


def placement_json(cert: CertifiedPlacement, spec: ModelSpec, profile: Profile) -> str:
    """The certificate's JSON plus ``sequence_capacity``: concurrent sequences per context length
    (empty when the model does not fit)."""
    body = json.loads(cert.to_json())
    table = capacity_table(cert, spec, profile) if cert.fits else ()
    body["sequence_capacity"] = [row.to_dict() for row in table]
    body["longest_context_one_sequence"] = longest_context(cert, spec, profile) if cert.fits else None
    body["model_max_context"] = spec.max_context_tokens or None
    body["kv_pool"] = pool_report(profile)
    body["expanded"] = [{"type": e.type_name, "tensors": e.tensors, "extra_bytes": e.extra_bytes} for e in spec.expanded]
    return json.dumps(body, indent=2)


def headline(cert: CertifiedPlacement, topology: Topology, binary: bool = False) -> str:
    """The outcome in one line, its figures those of the stages drawn below it (for a model that does not
    fit: the best attempt's overflowing stage), in binary units where the devices were given in them."""
    kind = "GPUs" if all(topology.device(s.placement.device_id).kind == "cuda" for s in cert.stages) else "devices"
    if cert.outcome == "fits_single":
        s = cert.stages[0]
        return f"Fits on {s.placement.device_id} ({format_bytes(s.headroom_bytes, binary)} headroom)"
    if cert.outcome == "fits_across":
        return f"Fits across {len(cert.stages)} {kind}"
    if not cert.attempt_devices:
        return cert.reasons[0] if cert.reasons else "Does not fit"
    k = cert.attempt_devices
    return (f"{cert.model_name} does not fit: with {k} device{'s' if k != 1 else ''} the best attempt needs "
            f"{format_bytes(cert.required_bytes, binary)} on {cert.limiting_device}, budget "
            f"{format_bytes(cert.budget_bytes, binary)} (short by {format_bytes(cert.deficit_bytes, binary)})")


def speed_line(cert: CertifiedPlacement) -> str:
    if cert.predicted is None:
        longest = cert.longest_context_tokens
        return f"longest context that would fit: {longest} tokens" if longest else "no context length fits"
    p = cert.predicted
    (dl, dh), (pl, ph) = p.decode_range, p.prefill_range
    return (
        f"predicted decode {dl:.0f}–{dh:.0f} tok/s, prefill {pl:.0f}–{ph:.0f} tok/s, "
        f"handoff {p.handoff_s_per_token * 1e6:.1f} us/token"
    )


def render_plan(cert: CertifiedPlacement, topology: Topology, binary: bool = False) -> None:
    from rich.table import Table

    from stagewise.console import console as make_console

    console = make_console()
    units = in_binary_units if binary else str
    console.print(f"[bold]{headline(cert, topology, binary)}[/bold]  ({cert.model_name}, {cert.objective})")
    if cert.stages:
        table = Table("stage", "device", "blocks", "entry/exit", "weights", "state", "workspace", "reserve", "total", "budget")
        for i, s in enumerate(cert.stages):
            sp, c = s.placement, s.charge
            ends = "+".join(n for n, on in (("entry", sp.entry), ("exit", sp.exit)) if on) or "-"
            table.add_row(
                str(i), sp.device_id, f"{sp.start}..{sp.end - 1}", ends,
                *(format_bytes(v, binary) for v in (c.weights_bytes, c.state_bytes, c.workspace_bytes,
                                                    c.reserve_bytes, c.total_bytes)),
                format_bytes(s.budget_bytes, binary),
            )
        console.print(table)
    console.print(speed_line(cert))
    for reason in cert.reasons[1 if not cert.fits else 0 :]:
        console.print(f"  - {units(reason)}")
    console.print(f"[dim]{cert.fingerprint}[/dim]")
