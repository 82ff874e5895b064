"""load_model: from a MODEL argument to a running pipeline, through one certified placement.

MODEL is a Hugging Face directory, a GGUF file, ``random:PRESET|CONFIG.json`` (deterministic random
weights generated on each device: benchmarks), or None for the embedded demo model. The steps are
always: spec (metadata only) -> topology -> plan (once) -> verify -> load each stage straight to
its device -> compare planned with measured charges.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from stagewise.engine.chat_template import DEFAULT_CHATML, ChatTemplate
from stagewise.engine.demo_model import DEMO_CONTEXT, DEMO_DEVICES, DEMO_PLACEMENT, ensure_demo_model
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.placement_summary import placement_summary
from stagewise.engine.tokenizer import Tokenizer
from stagewise.errors import ConfigError, PlacementError
from stagewise.hardware.device_spec import resolve_device_spec
from stagewise.hardware.reserve_policy import ReservePolicy
from stagewise.hardware.topology import Topology
from stagewise.placement import CertifiedPlacement, plan, verify
from stagewise.runtime.builder import StageProgress, build_pipeline
from stagewise.runtime.executor import Executor
from stagewise.runtime.stage import StageSpec
from stagewise.runtime.worker_mode import check_worker_options
from stagewise.spec.model_config import ModelConfig
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.profile import (
    DEFAULT_PREFILL_CHUNK_TOKENS,
    Profile,
    default_activation_dtype,
    runtime_workspace_for,
)
from stagewise.weights.tensor_source import TensorSource

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
_SPEC_DTYPE = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
DEFAULT_CONTEXT = 4096
AUTO_MAX_SEQS = (64, 32, 16, 8, 4, 2, 1)  # `--max-seqs auto`: the most of these that fit on as many devices as one needs


@dataclass(frozen=True)
class OpenedModel:
    """A model's metadata and tensor source, before any placement."""

    name: str
    config: ModelConfig
    source: TensorSource
    tokenizer: Tokenizer | None
    gguf_path: Path | None = None


def parse_placement(text: str) -> int | None:
    """``auto`` -> None (planner's choice), ``single`` -> 1, ``pipeline:N`` -> N."""
    if text == "auto":
        return None
    if text == "single":
        return 1
    if text.startswith("pipeline:") and text[9:].isdigit() and int(text[9:]) >= 1:
        return int(text[9:])
    raise PlacementError(f"--placement must be auto, single or pipeline:N, got {text!r}")


def open_model(model: str) -> OpenedModel:
    """Open a model path (or ``random:…``) without loading any weights."""
    if model.startswith("random:"):
        from stagewise.weights.make_model import load_hf_config
        from stagewise.weights.random_source import RandomSource

        preset, _, fmt = model[len("random:") :].partition("@")  # random:PRESET[@q8_0|@q4_k|…]
        raw = load_hf_config(preset)
        config = ModelConfig.from_hf_dict(raw, source=model)
        return OpenedModel(model, config, RandomSource(config, fmt=fmt or "dense"), None)
    from stagewise.weights.open_source import open_source

    path = Path(model)
    source = open_source(path)
    gguf_config = getattr(source, "config", None)
    if isinstance(gguf_config, ModelConfig):  # GGUF: metadata and tokenizer live in the file
        fields = getattr(source, "fields", {})
        tokenizer = Tokenizer.from_gguf_fields(fields) if "tokenizer.ggml.tokens" in fields else None
        gguf_path = path
        return OpenedModel(path.name, gguf_config, source, tokenizer, gguf_path)
    config = ModelConfig.from_path(path)
    tokenizer = Tokenizer.from_dir(path) if (path / "tokenizer.json").exists() else None
    return OpenedModel(path.name, config, source, tokenizer)


def check_dtype(dtype: str | None) -> None:
    """Refuse a ``--dtype`` that is not one of :data:`DTYPES` (before anything is opened)."""
    if dtype is not None and dtype not in DTYPES:
        raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def run_dtype_for(dtype: str | None, topology: Topology) -> torch.dtype:
    """The checked ``--dtype``, else the default for the devices (bfloat16 on accelerators, float32 on CPUs)."""
    return DTYPES[dtype or default_activation_dtype({d.kind for d in topology.devices})]


def model_spec(opened: OpenedModel, dtype: torch.dtype) -> ModelSpec:
    """Metadata-only accounting of the model as it will be resident at ``dtype``."""
    if opened.gguf_path is not None:
        from stagewise.weights.gguf_source import GGUFSource
        from stagewise.weights.gguf_spec import model_spec_from_gguf

        assert isinstance(opened.source, GGUFSource)  # the file is already open: no second parse
        return model_spec_from_gguf(opened.source, run_dtype=_SPEC_DTYPE[dtype])
    if getattr(opened.source, "fmt", "dense") != "dense":  # random packed weights: exact packed bytes
        from stagewise.weights.source_spec import spec_from_source

        return spec_from_source(opened.config, opened.source, _SPEC_DTYPE[dtype], opened.name)
    return ModelSpec.from_config(opened.config, _SPEC_DTYPE[dtype], name=opened.name)


def stage_specs(cert: CertifiedPlacement, topology: Topology) -> list[StageSpec]:
    """The executor's view of a certified placement."""
    specs = []
    for k, st in enumerate(cert.stages):
        p = st.placement
        if p.shard.is_sharded:
            raise PlacementError(f"stage {k} on {p.device_id}: sharded stages (degree > 1) cannot be executed yet")
        device = topology.device(p.device_id)
        if not device.executable:
            raise PlacementError(f"device {p.device_id} is simulated: it can be planned for, not run on")
        specs.append(StageSpec(k, p.device_id, device.torch_device, p.start, p.end, p.entry, p.exit,
                               st.budget_bytes, st.charge.weights_bytes, st.charge.state_bytes,
                               st.charge.workspace_bytes))
    return specs


def load_model(model: str | None, devices: str | None = None, placement: str = "auto",
               context: int = DEFAULT_CONTEXT, dtype: str | None = None, progress: StageProgress | None = None,
               prefill_chunk: int = DEFAULT_PREFILL_CHUNK_TOKENS, reserve: str | None = None, objective: str = "latency",
               on_plan: Callable[[CertifiedPlacement], None] | None = None, timing: bool = False,
               cuda_graphs: bool = True, workers: str | None = None, worker_timeout_s: float = 30.0,
               join_timeout_s: float = 120.0, rejoin: bool = True, measure_links: bool = True,
               max_seqs: int | None = 1, worker_secret_file: str | None = None,
               kv_tokens: int | None = None, prefix_snapshots: int | None = None) -> LoadedModel:
    """Plan and load ``model``; raises :class:`DoesNotFit` (with the reason) when nothing fits.

    ``workers``: None runs every stage in this process; ``local`` spawns one worker process per
    stage; ``N@HOST:PORT`` waits for N ``stagewise worker --join`` processes (any host) and plans
    on the devices they offer. Then ``pipeline`` is a :class:`DistributedPipeline` (same surface,
    plus ``health()``); ``worker_timeout_s`` bounds a step, ``join_timeout_s`` joining and loading,
    ``rejoin=False`` fails for good when a worker is lost, ``measure_links=False`` plans on the
    default figures of the links between workers instead of timing them (see docs/multihost.md);
    ``worker_secret_file``: the secret shared with remote workers (default: the environment).

    ``max_seqs``: sequences run at once (continuous batching), each with ``context`` positions of
    state on every stage, all charged by the planner; None (``auto``) takes the most of
    :data:`AUTO_MAX_SEQS` that fit on as many devices as one sequence needs; stages in worker
    processes hold the same rows and KV pool. ``kv_tokens``: the KV pool every stage holds, in positions shared by
    all sequences (rounded up to blocks); None: ``max_seqs × context`` (every sequence its whole context).
    ``prefix_snapshots``: recurrent-state snapshot entries for the prefix cache (hybrid models; every
    stage that keeps recurrent state holds them, charged); None: one per sequence slot.
    """
    if model is None:
        model = str(ensure_demo_model())
        devices = devices or DEMO_DEVICES
        placement = DEMO_PLACEMENT if placement == "auto" else placement
        context = DEMO_CONTEXT if context == DEFAULT_CONTEXT else context
        name = "demo"
    else:
        name = ""
    stages = parse_placement(placement)
    check_dtype(dtype)
    check_worker_options(workers)  # before any store, socket or worker exists
    opened = open_model(model)
    pool, cluster, joins = None, None, None
    if workers is not None:
        from stagewise.runtime.distributed_start import cluster_topology, open_pool

        pool = open_pool(workers, worker_timeout_s, secret_file=worker_secret_file)
        if not pool.mode.local:
            # plan on the devices the workers offer, across links timed at one activation (bf16 unless told)
            itemsize = DTYPES[dtype].itemsize if dtype is not None else 2
            activation_bytes = opened.config.hidden_size * itemsize
            cluster, joins = cluster_topology(pool, join_timeout_s, measure_links, activation_bytes)
    topology = cluster.topology if cluster else resolve_device_spec(devices, ReservePolicy.parse(reserve))
    run_dtype = run_dtype_for(dtype, topology)
    spec = model_spec(opened, run_dtype)
    profile = Profile(context_tokens=context, batch=max_seqs or 1, prefill_chunk_tokens=prefill_chunk,
                      runtime_workspace_bytes=runtime_workspace_for({d.kind for d in topology.devices}),
                      activation_dtype=_SPEC_DTYPE[run_dtype], kv_tokens=kv_tokens,
                      prefix_snapshots=max_seqs or 1 if prefix_snapshots is None else prefix_snapshots)
    cert = plan(spec, topology, profile, objective=objective, stages=stages).require_fit()
    if max_seqs is None:  # auto: as many sequences as fit without more devices
        for count in AUTO_MAX_SEQS[:-1]:
            wider = dataclasses.replace(profile, batch=count,
                                        prefix_snapshots=count if prefix_snapshots is None else prefix_snapshots)
            try:
                candidate = plan(spec, topology, wider, objective=objective, stages=stages or len(cert.stages))
            except PlacementError:  # no legal placement on that many stages with this many slots
                continue
            if candidate.fits:
                profile, cert = wider, candidate
                break
    verify(cert, spec, topology, profile)
    if on_plan is not None:
        on_plan(cert)
    specs = stage_specs(cert, topology)
    links = [topology.link(a.device, b.device).kind for a, b in itertools.pairwise(specs)]
    if pool is not None:
        from stagewise.runtime.distributed_start import start_workers

        path = model if model.startswith("random:") else str(Path(model).resolve())
        pipeline: Executor = start_workers(pool, opened.config, path, specs, run_dtype, context, cluster, joins,
                                           join_timeout_s, join_timeout_s, rejoin, cuda_graphs=cuda_graphs,
                                           batch=profile.batch, kv_blocks=profile.kv_pool_blocks,
                                           snapshots=profile.prefix_snapshots)
    else:
        pipeline = build_pipeline(opened.config, opened.source, specs, run_dtype, profile.batch, context, links,
                                  progress, timing=timing, kv_blocks=profile.kv_pool_blocks,
                                  snapshots=profile.prefix_snapshots)
    if cuda_graphs:
        for stage in pipeline.stages:
            stage.enable_graphs()  # decode steps replay as CUDA graphs
    tokenizer = opened.tokenizer
    template = ChatTemplate((tokenizer.chat_template if tokenizer else None) or DEFAULT_CHATML)
    placement_json = cert.to_dict()
    return LoadedModel(name or opened.name, opened.config, pipeline, placement_json,
                       placement_summary(cert, topology), tokenizer, template, context, run_dtype, spec, topology)


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The options every command that loads a model shares."""
    p.add_argument("--devices", default=None, help="device SPEC (default: every device found; demo: cpu:2x12MiB)")
    p.add_argument("--placement", default="auto", help="auto | single | pipeline:N")
    p.add_argument("--context", type=int, default=DEFAULT_CONTEXT, help="context length to reserve (tokens)")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: bf16 on GPUs, f32 on CPU)")
    p.add_argument("--prefill-chunk", type=int, default=DEFAULT_PREFILL_CHUNK_TOKENS,
                   help=f"tokens per step that prefills prompts, decoding rows beside them counted "
                        f"(default {DEFAULT_PREFILL_CHUNK_TOKENS}, as assess and plan assume)")
    p.add_argument("--reserve", default=None, help="per-device reserve policy (see `stagewise devices --help`)")
    p.add_argument("--kv-tokens", type=int, default=None, metavar="N",
                   help="KV cache pool per stage, in positions shared by all sequences (64-position blocks); "
                        "a sequence that needs a block when none is free preempts the newest one (recomputed "
                        "later). Default: every sequence slot its whole --context")
    p.add_argument("--workers", nargs="?", const="local", default=None, metavar="local|N@HOST:PORT",
                   help="run stages in worker processes: one per stage here (`local`, the default), or wait for N "
                        "`stagewise worker --join HOST:PORT` on any host (see docs/multihost.md)")
    p.add_argument("--worker-timeout", type=float, default=30.0, help="seconds a step may take before a worker "
                   "is declared lost (with --workers)")
    p.add_argument("--worker-secret-file", metavar="PATH", default=None,
                   help="with --workers N@HOST:PORT: the secret shared with the workers (their --secret-file); "
                        "default: $STAGEWISE_WORKER_SECRET_FILE or $STAGEWISE_WORKER_SECRET")
    p.add_argument("--no-measure-links", dest="measure_links", action="store_false",
                   help="with --workers N@HOST:PORT: plan on default figures for the links between workers "
                        "instead of timing them when they join")
    p.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                   help="run decode steps and prefill chunks eagerly instead of replaying CUDA graphs")


def load_with_progress(show: bool = True, **kwargs: Any) -> LoadedModel:
    """:func:`load_model` (keyword arguments) with a rich progress bar per stage unless ``show`` is False."""
    from stagewise.engine.load_progress import LoadProgress

    with LoadProgress(enabled=show) as bar:
        return load_model(progress=bar.update, on_plan=bar.start, **kwargs)


def load_model_from_args(args: argparse.Namespace, quiet: bool = False, **kwargs: Any) -> LoadedModel:
    """``load_model`` with the options of :func:`add_model_arguments`, showing progress unless ``quiet``."""
    options = dict(model=args.model, devices=args.devices, placement=args.placement, context=args.context,
                   dtype=args.dtype, prefill_chunk=args.prefill_chunk, reserve=args.reserve,
                   cuda_graphs=args.cuda_graphs, workers=args.workers, worker_timeout_s=args.worker_timeout,
                   measure_links=args.measure_links, worker_secret_file=args.worker_secret_file,
                   kv_tokens=args.kv_tokens)
    return load_with_progress(not quiet, **(options | kwargs))
