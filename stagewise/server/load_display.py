"""The startup banner: where the model went, the profile chosen, and planned vs measured per stage and part."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from stagewise.engine.load_settings import LoadSettings
from stagewise.hardware.sizes import format_bytes
from stagewise.server.serve_settings import ServeSettings

if TYPE_CHECKING:  # NOTE: not at run time: the API process prints the usage lines and imports no torch
    from stagewise.engine.loaded_model import LoadedModel
    from stagewise.runtime.stage import ChargeCheck

API_KEY_ENV = "STAGEWISE_API_KEY"  # serve's --api-key when not given (cli/cmd_serve.py)


def check_line(check: ChargeCheck) -> str:
    """One stage: each part planned · measured, the workspace as the allocator's peak above the resident
    tensors, and the certified charge beside the measured peak (when the load check measured it)."""
    head = f"  stage {check.stage} on {check.device}: "
    if not check.planned_bytes:
        return head + f"measured {format_bytes(check.measured_bytes)} (no planned charge)"
    if not check.measured_weights_bytes:  # a worker's stage: its reported total only
        return head + (f"weights + state planned {format_bytes(check.planned_bytes)} · measured "
                       f"{format_bytes(check.measured_bytes)} (planned/measured {check.ratio:.2f})")
    parts = [f"weights {format_bytes(check.planned_weights_bytes)} · {format_bytes(check.measured_weights_bytes)}",
             f"state {format_bytes(check.planned_state_bytes)} · {format_bytes(check.measured_state_bytes)}"]
    if check.measured_workspace_bytes is None or check.measured_peak_bytes is None:
        parts.append(f"workspace {format_bytes(check.planned_workspace_bytes)} · not measured")
        return head + "planned · measured: " + "; ".join(parts)
    parts.append(f"workspace {format_bytes(check.planned_workspace_bytes)} · "
                 f"{format_bytes(check.measured_workspace_bytes)} (peak above resident)")
    verdict = "within" if check.measured_peak_bytes <= check.planned_total_bytes else "OVER"
    parts.append(f"total {format_bytes(check.planned_total_bytes)} certified · peak "
                 f"{format_bytes(check.measured_peak_bytes)} ({check.peak_ratio:.3f}, {verdict})")
    return head + "planned · measured: " + "; ".join(parts)


def placement_lines(model: LoadedModel) -> list[str]:
    """The placement summary, what the profile is, and per stage planned vs measured."""
    lines = [model.placement_summary]
    if model.choice:
        lines.append(f"  profile: {model.choice}")
    lines += [check_line(check) for check in model.charge_checks()]
    return lines


def usage_lines(settings: ServeSettings, key_in_env: bool) -> list[str]:
    """How to reach the server, as commands that run as printed in a POSIX shell: a ``curl`` (the API key
    read from ``$STAGEWISE_API_KEY`` in double quotes, so the shell expands it; ``key_in_env``: the server's
    key is that variable's, else a line first says to set it) and the ``stagewise chat`` that loads the same
    model the same way in-process."""
    lines = []
    auth = ""
    if settings.api_key:
        auth = f' -H "Authorization: Bearer ${API_KEY_ENV}"'
        if not key_in_env:
            lines.append(f"  (with {API_KEY_ENV} set to the --api-key value)")
    body = shlex.quote('{"messages": [{"role": "user", "content": "Hello"}]}')
    lines.append(f"  curl {settings.base_url}/chat/completions -H 'Content-Type: application/json'{auth} -d {body}")
    lines.append("  or chat in the terminal (a second copy, in-process): " + shlex.join(chat_command(settings)))
    return lines


def chat_command(settings: ServeSettings) -> list[str]:
    """``stagewise chat`` with the model and the loading options ``serve`` was given (those not at their default)."""
    load, defaults = settings.load, LoadSettings()
    command = ["stagewise", "chat", *([load.model] if load.model else [])]
    for flag, value, default in (("--devices", load.devices, defaults.devices),
                                 ("--placement", load.placement, defaults.placement),
                                 ("--context", load.context, defaults.context),
                                 ("--dtype", load.dtype, defaults.dtype),
                                 ("--kv-dtype", load.kv_dtype, defaults.kv_dtype),
                                 ("--prefill-chunk", load.prefill_chunk, defaults.prefill_chunk),
                                 ("--reserve", load.reserve, defaults.reserve),
                                 ("--kv-tokens", load.kv_tokens, defaults.kv_tokens)):
        if value != default:
            command += [flag, str(value)]
    if not load.cuda_graphs:
        command.append("--no-cuda-graphs")
    return command
