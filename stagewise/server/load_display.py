"""The startup banner: where the model went, and planned vs measured charge per stage."""

from __future__ import annotations

from stagewise.engine.loaded_model import LoadedModel
from stagewise.hardware.sizes import format_bytes


def placement_lines(model: LoadedModel) -> list[str]:
    """The placement summary and, per stage, planned vs measured charge."""
    lines = [model.placement_summary]
    for check in model.charge_checks():
        measured = format_bytes(check.measured_bytes)
        if check.planned_bytes:
            lines.append(f"  stage {check.stage} on {check.device}: planned {format_bytes(check.planned_bytes)}"
                         f" · measured {measured} (planned/measured {check.ratio:.2f})")
        else:
            lines.append(f"  stage {check.stage} on {check.device}: measured {measured} (no planned charge)")
    return lines
