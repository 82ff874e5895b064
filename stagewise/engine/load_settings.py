"""LoadSettings: what loading a model was asked for, converted once from the command line (or a caller).

Every command that loads a model (``run``, ``chat``, ``bench``, ``serve``) turns its options into one
frozen :class:`LoadSettings` at the edge (:func:`load_settings_from_args`); nothing downstream reads
the argparse namespace. ``None`` means *decide for me*: the context (the longest that fits), the
sequences (``--max-seqs auto``) and the prefill chunk (512, traded down to 128 when a set
``--context`` needs it). What is decided lands in one :class:`~stagewise.spec.profile.Profile`, carried
by the :class:`~stagewise.engine.loaded_model.LoadedModel` (see :mod:`stagewise.placement.profile_fit`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Any

from stagewise.errors import ConfigError
from stagewise.hardware.device_spec import is_topology_file, parse_device_spec
from stagewise.hardware.reserve_policy import ReservePolicy
from stagewise.runtime.worker_mode import check_worker_options
from stagewise.spec.kv_pool import KV_DTYPES
from stagewise.spec.profile import DEFAULT_PREFILL_CHUNK_TOKENS, MAX_CONTEXT_TOKENS

DTYPE_NAMES = ("float32", "bfloat16", "float16", "f32", "bf16", "f16")
OBJECTIVES = ("latency", "throughput")


@dataclass(frozen=True)
class LoadSettings:
    """The options of one model load, validated once.

    ``model``: a directory, GGUF file, ``random:PRESET[@TYPE]`` or None (the demo). ``context``: positions
    per sequence (None: the longest that fits one sequence, within the model's
    ``max_position_embeddings``). ``max_seqs``: sequence slots (None: ``auto``). ``prefill_chunk``:
    tokens per prefill step (None: the default, traded down when a set context needs it).
    ``kv_dtype``: the KV cache's storage (None: the activation dtype; ``fp8``: float8 e4m3 with scales).
    """

    model: str | None = None
    devices: str | None = None
    placement: str = "auto"
    context: int | None = None
    dtype: str | None = None
    prefill_chunk: int | None = None
    reserve: str | None = None
    objective: str = "latency"
    max_seqs: int | None = 1
    kv_tokens: int | None = None
    kv_dtype: str | None = None
    prefix_snapshots: int | None = None  # recurrent-state snapshot entries (hybrids' prefix cache); None: one a slot
    cuda_graphs: bool = True
    timing: bool = False
    workers: str | None = None  # None: stages in this process; "local", "N@HOST:PORT" or "ray:N": worker processes
    worker_timeout_s: float = 30.0
    join_timeout_s: float = 120.0
    rejoin: bool = True
    measure_links: bool = True  # time the links between joined workers before planning
    worker_secret_file: str | None = None  # remote workers' shared secret (default: the environment)

    def __post_init__(self) -> None:
        for flag, value, lo, hi in (("--context", self.context, 2, MAX_CONTEXT_TOKENS),
                                    ("--prefill-chunk", self.prefill_chunk, 1, 1 << 20),
                                    ("--max-seqs", self.max_seqs, 1, 4096),
                                    ("--kv-tokens", self.kv_tokens, 1, 1 << 36),
                                    ("prefix_snapshots", self.prefix_snapshots, 0, 1 << 16)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi):
                raise ConfigError(f"{flag} must be an integer in [{lo}, {hi}], got {value!r}")
        if self.dtype is not None and self.dtype not in DTYPE_NAMES:
            raise ConfigError(f"--dtype must be one of {', '.join(DTYPE_NAMES)}, got {self.dtype!r}")
        if self.kv_dtype is not None and self.kv_dtype not in KV_DTYPES:
            raise ConfigError(f"--kv-dtype must be one of {', '.join(KV_DTYPES)}, got {self.kv_dtype!r}")
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"objective {self.objective!r} must be one of {', '.join(OBJECTIVES)}")
        if not self.worker_timeout_s > 0 or not self.join_timeout_s > 0:
            raise ConfigError("worker and join timeouts must be > 0 seconds")
        check_worker_options(self.workers)  # a malformed --workers: refused before any socket or store opens
        # a malformed --reserve or --devices too (serve would listen, then fail loading); parsed, no hardware read
        ReservePolicy.parse(self.reserve)
        if self.devices is not None and not is_topology_file(self.devices):
            parse_device_spec(self.devices)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The options every command that loads a model shares (read back by :func:`load_settings_from_args`)."""
    p.add_argument("--devices", default=None, help="device SPEC (default: every device found; demo: cpu:2x11.5MiB)")
    p.add_argument("--placement", default="auto", help="auto | single | pipeline:N")
    p.add_argument("--context", type=int, default=None,
                   help="positions per sequence (default: the longest that fits one sequence, up to the model's "
                        "max_position_embeddings); when set and it does not fit, fewer sequences, then smaller "
                        "prefill chunks (down to 128), before refusing")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: bf16 on GPUs, f32 on CPU)")
    p.add_argument("--kv-dtype", default=None, choices=KV_DTYPES,
                   help="KV cache storage: bf16, f16, f32 or fp8 (float8 e4m3 with a scale per position and head; "
                        "half the memory of bf16). Default: the activation dtype")
    p.add_argument("--prefill-chunk", type=int, default=None,
                   help=f"tokens per step that prefills prompts, decoding rows beside them counted "
                        f"(default {DEFAULT_PREFILL_CHUNK_TOKENS}, as assess and plan assume)")
    p.add_argument("--reserve", default=None, help="per-device reserve policy (see `stagewise devices --help`)")
    p.add_argument("--kv-tokens", type=int, default=None, metavar="N",
                   help="KV cache pool per stage, in positions shared by all sequences (64-position blocks); "
                        "a sequence that needs a block when none is free preempts the newest one (recomputed "
                        "later). Default: every sequence slot its whole --context")
    p.add_argument("--workers", nargs="?", const="local", default=None, metavar="local|N@HOST:PORT|ray:N",
                   help="run stages in worker processes: one per stage here (`local`, the default), wait for N "
                        "`stagewise worker --join HOST:PORT` on any host, or place N worker actors on an existing "
                        "Ray cluster (`ray:N[@ADDRESS]`; --devices: what each offers) (see docs/multihost.md)")
    p.add_argument("--worker-timeout", type=float, default=30.0, help="seconds a step may take before a worker "
                   "is declared lost (with --workers)")
    p.add_argument("--worker-secret-file", metavar="PATH", default=None,
                   help="with --workers N@HOST:PORT: the secret shared with the workers (their --secret-file); "
                        "default: $STAGEWISE_WORKER_SECRET_FILE or $STAGEWISE_WORKER_SECRET")
    p.add_argument("--no-measure-links", dest="measure_links", action="store_false",
                   help="with --workers N@HOST:PORT: plan on default figures for the links between workers "
                        "instead of timing them when they join")
    p.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                   help="run every step eagerly instead of replaying CUDA graphs (decode steps whole, steps with "
                        "prompts piece by piece between their attention / linear-attention mixers)")


def load_settings_from_args(args: argparse.Namespace, **overrides: Any) -> LoadSettings:
    """The :class:`LoadSettings` of a command's parsed options (:func:`add_model_arguments`, plus
    ``--max-seqs`` where the command has it); ``overrides`` replace fields (a command's own choices)."""
    values: dict[str, Any] = dict(
        model=args.model, devices=args.devices, placement=args.placement, context=args.context, dtype=args.dtype,
        prefill_chunk=args.prefill_chunk, reserve=args.reserve, kv_tokens=args.kv_tokens, kv_dtype=args.kv_dtype,
        cuda_graphs=args.cuda_graphs, workers=args.workers, worker_timeout_s=args.worker_timeout,
        measure_links=args.measure_links, worker_secret_file=args.worker_secret_file)
    if hasattr(args, "max_seqs"):
        values["max_seqs"] = args.max_seqs
    return LoadSettings(**(values | overrides))
