"""One-off (issue 44): serve's load and warm-up of Qwen3.6 in process, to bisect its "non-finite logits".

nan_call3 (nan_warmup_h100/call3/): `serve` fails its full-context step unless CUDA_LAUNCH_BLOCKING=1, while
nan_full_context.py (its own Batcher, no engine) passes with and without per-step synchronization. This script
takes serve's own path minus the processes: the CLI's settings, engine_core's loader, Engine(...).warm_up(), then
(ROUNDS) more full-context steps. Env: METER=0 (PeakMeter's calls made no-ops: no synchronize, no reset, no
memory snapshot), ARGS (extra serve arguments).

    PYTHONPATH=. python3 bench/results/hybrid_serving_h200/nan_engine.py
"""
import os
import shlex
import sys
import traceback

sys.path.insert(0, ".")
from stagewise.cli.cmd_serve import settings_from_args
from stagewise.cli.main import build_parser
from stagewise.engine.engine import Engine
from stagewise.engine.warm_up import full_context_step
from stagewise.runtime import peak_memory
from stagewise.server.engine_core import _load

if os.environ.get("METER") == "0":
    peak_memory.PeakMeter.start = lambda self: None  # type: ignore[method-assign]
    peak_memory.PeakMeter.checkpoint = lambda self: None  # type: ignore[method-assign]
    peak_memory.PeakMeter.read = lambda self: {}  # type: ignore[method-assign]
argv = ["serve", os.environ.get("MODEL", "random:qwen3.6-35b-a3b@q8_0"), "--devices", "cuda:0", "--placement",
        "single", "--max-seqs", "8", "--context", "4096", *shlex.split(os.environ.get("ARGS", ""))]
settings = settings_from_args(build_parser().parse_args(argv))
model = _load(settings, lambda message: print("engine message:", message, flush=True))
assert model is not None
engine = Engine(model, settings.queue, prefix_cache=settings.prefix_cache)
for attempt in range(int(os.environ.get("ROUNDS", "3"))):
    try:
        if attempt == 0:
            print("warm-up:", engine.warm_up(full_context=True).summary(), flush=True)
        else:
            full_context_step(engine.batcher, model.config.vocab_size)
            print(f"full-context step {attempt}: passed", flush=True)
    except Exception as exc:  # a one-off probe: report and go on
        print(f"round {attempt}: {type(exc).__name__}: {exc}", flush=True)
        traceback.print_exc()
