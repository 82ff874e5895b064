"""The startup banner: where the model went, and planned vs measured charge per stage."""

from __future__ import annotations

import shlex

from stagewise.engine.load_settings import LoadSettings
from stagewise.engine.loaded_model import LoadedModel
from stagewise.hardware.sizes import format_bytes
from stagewise.server.serve_settings import ServeSettings

API_KEY_ENV = "STAGEWISE_API_KEY"  # serve's --api-key when not given (cli/cmd_serve.py)


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
