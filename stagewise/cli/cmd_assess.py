"""``stagewise assess MODEL|DIR``: does a model fit, where, and how fast (bars per device).

With a directory of models (no config.json of its own) it prints one row per model.
``--json`` prints the same object as ``plan --json``. Exit status 0 unless the input is bad.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from stagewise.cli.cmd_plan import add_common, devices_and_profile, headline, inputs, placement_json, speed_line
from stagewise.errors import StagewiseError
from stagewise.hardware.sizes import format_bytes, in_binary_units, uses_binary_units
from stagewise.hardware.topology import Topology
from stagewise.placement import CertifiedPlacement, assess
from stagewise.placement.sequence_capacity import (
    capacity_line,
    capacity_table,
    longest_context,
    longest_line,
    pool_line,
)
from stagewise.spec.charge import Charge
from stagewise.spec.model_source import catalog_entries, is_catalog, load_model_spec
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.profile import Profile

BAR_WIDTH = 48


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("assess", help="does a model fit these devices, and how fast")
    add_common(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if is_catalog(args.model):
        return _catalog(args)
    spec, topology, profile = inputs(args)
    cert = assess(spec, topology, profile, args.objective)
    if args.json:
        print(placement_json(cert, spec, profile))
        return 0
    _render(cert, spec, topology, profile, uses_binary_units(args.devices))
    return 0


def _render(cert: CertifiedPlacement, spec: ModelSpec, topology: Topology, profile: Profile, binary: bool) -> None:
    """The outcome as one story: the headline names the attempt the bars draw (the placement, or for a
    model that does not fit the best attempt with the stage that overflows), in the units the devices
    were given in."""
    from stagewise.console import console as make_console

    console = make_console()
    units = in_binary_units if binary else str
    console.print(f"[bold]{headline(cert, topology, binary)}[/bold]  ({spec.name}, {spec.format}, context "
                  f"{profile.context_tokens:,}{', fp8 KV' if profile.kv_storage == 'fp8' else ''})")
    drawn = {s.placement.device_id: s for s in (cert.stages if cert.fits else cert.attempt)}
    for d in topology.devices:
        stage = drawn.get(d.id)
        if stage is not None:
            sp = stage.placement
            label = f"blocks {sp.start}..{sp.end - 1}" + (" +entry" if sp.entry else "") + (" +exit" if sp.exit else "")
            console.print(_bar(d.id, stage.charge, d.budget_bytes, label, binary))
        elif not cert.fits and cert.attempt:
            console.print(f"{d.id:>8} not reached (budget {format_bytes(d.budget_bytes, binary)}): "
                          "the attempt overflows an earlier stage")
        else:
            console.print(f"{d.id:>8} unused (budget {format_bytes(d.budget_bytes, binary)})")
    console.print("[blue]█ weights[/blue] [green]█ state[/green] [yellow]█ workspace[/yellow] [magenta]█ reserve[/magenta]")
    console.print(speed_line(cert))
    if cert.fits:
        console.print(pool_line(profile))
        console.print(longest_line(longest_context(cert, spec, profile), spec))
        console.print(capacity_line(capacity_table(cert, spec, profile), profile))
    for reason in cert.reasons[1 if not cert.fits else 0 :]:
        console.print(f"  - {units(reason)}")
    for line in expansion_lines(spec, profile, binary):
        console.print(f"  - {line}")


def expansion_lines(spec: ModelSpec, profile: Profile, binary: bool = False) -> list[str]:
    """One line per type the loader dequantizes: "3 tensors of IQ2_XS are expanded to bf16: +1.2 GB"."""
    return [f"{e.tensors} tensor{'s' if e.tensors != 1 else ''} of {e.type_name} "
            f"{'are' if e.tensors != 1 else 'is'} expanded to {profile.activation_dtype}: "
            f"+{format_bytes(e.extra_bytes, binary)}"
            for e in spec.expanded]


def _bar(device_id: str, charge: Charge, budget: int, label: str, binary: bool = False) -> Any:
    from rich.text import Text

    scale = max(budget, charge.total_bytes, 1)
    text = Text(f"{device_id:>8} ")
    used = 0
    for value, style in (
        (charge.weights_bytes, "blue"),
        (charge.state_bytes, "green"),
        (charge.workspace_bytes, "yellow"),
        (charge.reserve_bytes, "magenta"),
    ):
        cells = round(value * BAR_WIDTH / scale)
        text.append("█" * cells, style=style)
        used += cells
    free = max(0, round(budget * BAR_WIDTH / scale) - used)
    text.append("·" * free, style="dim")
    over = charge.total_bytes > budget
    text.append(
        f" {format_bytes(charge.total_bytes, binary)} / {format_bytes(budget, binary)} {label}" + (" OVER" if over else ""),
        style="red" if over else "",
    )
    return text


def _catalog(args: argparse.Namespace) -> int:
    from rich.table import Table

    from stagewise.console import console as make_console

    topology, profile = devices_and_profile(args)
    rows: list[dict[str, Any]] = []
    for path in catalog_entries(args.model):
        try:
            spec = load_model_spec(path, args.fmt, run_dtype=profile.activation_dtype)
            cert = assess(spec, topology, profile, args.objective)
            rows.append({**cert.to_dict(), "model": path.name})
        except StagewiseError as exc:
            rows.append({"model": path.name, "outcome": "error", "error": str(exc)})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    table = Table("model", "outcome", "devices", "decode tok/s", "prefill tok/s")
    for r in rows:
        pred = r.get("predicted") or {}
        devices = ",".join(s["device"] for s in r.get("stages", [])) or r.get("error", "-")
        decode = "–".join(f"{v:.0f}" for v in pred.get("decode_tokens_per_s_range", [])) or "-"
        prefill = "–".join(f"{v:.0f}" for v in pred.get("prefill_tokens_per_s_range", [])) or "-"
        table.add_row(r["model"], r["outcome"], devices, decode, prefill)
    make_console().print(table)
    return 0
