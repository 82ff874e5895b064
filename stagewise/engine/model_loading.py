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
from pathlib import Path
from typing import Any

import torch

from stagewise.engine.chat_template import ChatTemplate
from stagewise.engine.demo_model import DEMO_CONTEXT, DEMO_DEVICES, DEMO_PLACEMENT, ensure_demo_model
from stagewise.engine.load_settings import LoadSettings, load_settings_from_args
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.opened_model import OpenedModel, open_model, open_model_source
from stagewise.engine.placement_summary import placement_summary
from stagewise.errors import ConfigError, PlacementError
from stagewise.hardware.device_spec import resolve_device_spec
from stagewise.hardware.reserve_policy import ReservePolicy
from stagewise.hardware.topology import Topology
from stagewise.placement import CertifiedPlacement, verify
from stagewise.placement.profile_fit import ProfileRequest, fit_profile
from stagewise.runtime.builder import StageProgress, build_pipeline
from stagewise.runtime.executor import Executor
from stagewise.runtime.stage import StageSpec
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.profile import Profile, default_activation_dtype, kernel_path_for
from stagewise.weights.chatml_template import DEFAULT_CHATML

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
_SPEC_DTYPE = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


def parse_placement(text: str) -> int | None:
    """``auto`` -> None (planner's choice), ``single`` -> 1, ``pipeline:N`` -> N."""
    if text == "auto":
        return None
    if text == "single":
        return 1
    if text.startswith("pipeline:") and text[9:].isdigit() and int(text[9:]) >= 1:
        return int(text[9:])
    raise PlacementError(f"--placement must be auto, single or pipeline:N, got {text!r}")


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
    """The executor's view of a certified placement (its profile's KV storage included)."""
    kv_dtype = "fp8" if cert.profile.kv_storage == "fp8" else None
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
                               st.charge.workspace_bytes, st.charge.reserve_bytes, kv_dtype))
    return specs


def load_model(model: str | None = None, devices: str | None = None, placement: str = "auto",
               context: int | None = None, progress: StageProgress | None = None,
               on_plan: Callable[[CertifiedPlacement], None] | None = None, **fields: Any) -> LoadedModel:
    """:func:`load` of ``LoadSettings(model=model, devices=devices, placement=placement, context=context,
    **fields)``: the keyword form tests and benchmarks use (see :class:`LoadSettings` for the fields)."""
    settings = LoadSettings(model=model, devices=devices, placement=placement, context=context, **fields)
    return load(settings, progress, on_plan)


def load(settings: LoadSettings, progress: StageProgress | None = None,
         on_plan: Callable[[CertifiedPlacement], None] | None = None) -> LoadedModel:
    """Plan and load ``settings.model``; raises :class:`DoesNotFit` (with the reason) when nothing fits.

    The profile (context, sequences, prefill chunk, KV dtype) is decided once by
    :func:`~stagewise.placement.profile_fit.fit_profile`, certified, verified, and carried in the
    returned :class:`LoadedModel`; every stage is built for exactly that profile.

    ``settings.workers``: None runs every stage in this process; ``local`` spawns one worker process per
    stage; ``N@HOST:PORT`` waits for N ``stagewise worker --join`` processes (any host) and plans
    on the devices they offer; ``ray:N`` places N worker actors on an existing Ray cluster (each offering
    ``settings.devices``, or the devices Ray gives it) and plans on those. Then ``pipeline`` is a :class:`DistributedPipeline` (same surface,
    plus ``health()``); ``worker_timeout_s`` bounds a step, ``join_timeout_s`` joining and loading,
    ``rejoin=False`` fails for good when a worker is lost, ``measure_links=False`` plans on the
    default figures of the links between workers instead of timing them (see docs/multihost.md);
    ``worker_secret_file``: the secret shared with remote workers (default: the environment).

    ``settings.prefix_snapshots``: recurrent-state snapshot entries for the prefix cache (hybrid models;
    every stage that keeps recurrent state holds them, charged); None: one per sequence slot.
    """
    model, name = settings.model, ""
    if model is None:
        model, name = str(ensure_demo_model()), "demo"
        settings = dataclasses.replace(
            settings, model=model, devices=settings.devices or DEMO_DEVICES,
            placement=DEMO_PLACEMENT if settings.placement == "auto" else settings.placement,
            context=DEMO_CONTEXT if settings.context is None else settings.context)
    stages = parse_placement(settings.placement)
    opened = open_model(model)
    pool, cluster, joins = None, None, None
    if settings.workers is not None:
        from stagewise.runtime.distributed_start import cluster_topology, open_pool

        pool = open_pool(settings.workers, settings.worker_timeout_s, secret_file=settings.worker_secret_file,
                         devices=settings.devices, opener=open_model_source)
        if not pool.mode.local:
            # plan on the devices the workers offer, across links timed at one activation (bf16 unless told)
            itemsize = DTYPES[settings.dtype].itemsize if settings.dtype is not None else 2
            activation_bytes = opened.config.hidden_size * itemsize
            cluster, joins = cluster_topology(pool, settings.join_timeout_s, settings.measure_links, activation_bytes)
    topology = cluster.topology if cluster else resolve_device_spec(settings.devices, ReservePolicy.parse(settings.reserve))
    run_dtype = run_dtype_for(settings.dtype, topology)
    _check_kv_dtype(settings, run_dtype)
    spec = model_spec(opened, run_dtype)
    base = Profile(kernel_path=kernel_path_for({d.kind for d in topology.devices}), activation_dtype=_SPEC_DTYPE[run_dtype],
                   kv_tokens=settings.kv_tokens, kv_dtype=settings.kv_dtype, cuda_graphs=settings.cuda_graphs)
    request = ProfileRequest(base, settings.context, settings.max_seqs, settings.prefill_chunk,
                             settings.prefix_snapshots)
    fitted = fit_profile(spec, topology, request, settings.objective, stages)
    profile, cert = fitted.profile, fitted.cert
    verify(cert, spec, topology, profile)
    if on_plan is not None:
        on_plan(cert)
    specs = stage_specs(cert, topology)
    links = [topology.link(a.device, b.device).kind for a, b in itertools.pairwise(specs)]
    if pool is not None:
        from stagewise.runtime.distributed_start import start_workers

        path = model if model.startswith("random:") else str(Path(model).resolve())
        pipeline: Executor = start_workers(pool, opened.config, path, specs, run_dtype, profile.context_tokens,
                                           cluster, joins, settings.join_timeout_s, settings.join_timeout_s,
                                           settings.rejoin, cuda_graphs=settings.cuda_graphs, batch=profile.batch,
                                           kv_blocks=profile.kv_pool_blocks, snapshots=profile.prefix_snapshots,
                                           packed_tokens=profile.step_tokens)
    else:
        pipeline = build_pipeline(opened.config, opened.source, specs, run_dtype, profile.batch,
                                  profile.context_tokens, links, progress, timing=settings.timing,
                                  kv_blocks=profile.kv_pool_blocks, snapshots=profile.prefix_snapshots)
    if settings.cuda_graphs:
        for stage in pipeline.stages:
            stage.enable_graphs(profile.step_tokens)  # decode and packed steps replay as CUDA graphs
    tokenizer = opened.tokenizer
    template = ChatTemplate((tokenizer.chat_template if tokenizer else None) or DEFAULT_CHATML)
    return LoadedModel(name or opened.name, opened.config, pipeline, cert.to_dict(), placement_summary(cert, topology),
                       tokenizer, template, profile, run_dtype, spec, topology, fitted.choice)


def load_with_progress(settings: LoadSettings, show: bool = True) -> LoadedModel:
    """:func:`load` with a rich progress bar per stage unless ``show`` is False."""
    from stagewise.engine.load_progress import LoadProgress

    with LoadProgress(enabled=show) as bar:
        return load(settings, progress=bar.update, on_plan=bar.start)


def _check_kv_dtype(settings: LoadSettings, run_dtype: torch.dtype) -> None:
    """KV kept in the run dtype, or fp8 (in this process: workers keep their KV in the run dtype)."""
    kv = settings.kv_dtype
    if kv is None or kv == _SPEC_DTYPE[run_dtype]:
        return
    if kv != "fp8":
        raise ConfigError(f"--kv-dtype {kv}: keys and values are kept in the run dtype ({_SPEC_DTYPE[run_dtype]}) "
                          "or fp8")
    if settings.workers is not None:
        raise ConfigError("--kv-dtype fp8 runs stages in this process only (not with --workers)")


def load_model_from_args(args: argparse.Namespace, quiet: bool = False, **overrides: Any) -> LoadedModel:
    """:func:`load` of the command's options (:func:`load_settings_from_args`, ``overrides`` replacing
    fields), showing progress unless ``quiet``."""
    return load_with_progress(load_settings_from_args(args, **overrides), not quiet)
