"""Starting a distributed pipeline: open the worker pool, learn the cluster, start the workers.

:func:`load_model` (engine) calls these around its one planning step:

- ``local``: plan on the given devices as usual, then :func:`start_workers` spawns one local
  worker process per stage;
- ``N@HOST:PORT``: :func:`cluster_topology` waits for N workers to join, merges their
  devices into one multi-host topology and (by default) has them time the links between them;
  the plan is made on it; :func:`start_workers` then
  assigns each stage to the worker that owns its device.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from stagewise.errors import WorkerNotJoined
from stagewise.runtime.cluster_links import ACTIVATION_BYTES, measure_cluster_links
from stagewise.runtime.distributed_topology import ClusterTopology, merge_reports, stage_owners
from stagewise.runtime.ray_workers import cluster_gpus, connect_ray
from stagewise.runtime.remote_pipeline import DistributedPipeline
from stagewise.runtime.stage import StageSpec
from stagewise.runtime.worker_messages import Assignment, JoinReport
from stagewise.runtime.worker_mode import WorkerMode
from stagewise.runtime.worker_pool import WorkerPool
from stagewise.runtime.worker_secret import require_secret
from stagewise.spec.model_config import ModelConfig

if TYPE_CHECKING:
    from stagewise.runtime.worker_segment import Opener


def open_pool(workers: str, timeout_s: float = 30.0, heartbeat_timeout_s: float = 10.0,
              secret_file: str | None = None, devices: str | None = None, opener: Opener | None = None) -> WorkerPool:
    """Host the rendezvous store and the control plane for ``workers`` (``local``, ``N@HOST:PORT`` or
    ``ray:N``): on 127.0.0.1 with a fresh secret for local workers; on HOST with the shared secret
    (``secret_file``, else ``$STAGEWISE_WORKER_SECRET_FILE`` / ``$STAGEWISE_WORKER_SECRET``) for remote
    ones; for Ray, on this node's address in the cluster with a fresh secret, the N actors placed
    (each offering ``devices``, None: the devices Ray gives it, and opening the model with ``opener``)."""
    mode = WorkerMode.parse(workers)
    if mode.ray:
        if opener is None:
            raise ValueError("Ray workers open the model themselves: open_pool needs an opener")
        mode = dataclasses.replace(mode, host=connect_ray(mode.ray_address or None))
        mode = dataclasses.replace(mode, count=mode.count or cluster_gpus())
    secret = None if mode.spawned else require_secret(secret_file, "the coordinator")
    pool = WorkerPool(mode, timeout_s, heartbeat_timeout_s, secret)
    if mode.ray:
        assert opener is not None  # checked above
        try:
            pool.launch_ray(devices, opener)
        except BaseException:
            pool.close(grace_s=0)
            raise
    return pool


def cluster_topology(pool: WorkerPool, join_timeout_s: float, measure_links: bool = True,
                     activation_bytes: int = ACTIVATION_BYTES) -> tuple[ClusterTopology, dict[int, JoinReport]]:
    """Wait for the pool's N remote workers and merge the devices they offer; with
    ``measure_links``, the links between workers carry measured figures (one handoff of
    ``activation_bytes`` and one large transfer; see :mod:`stagewise.runtime.cluster_links`).

    On any failure the joined workers are sent home before the error propagates."""
    ranks = list(range(1, pool.count + 1))
    try:
        joins = pool.wait_joins(ranks, join_timeout_s)
    except WorkerNotJoined as exc:  # send home the ones that did come
        refuse(pool, {r: rep for r in ranks if (rep := pool.report(r)) is not None}, str(exc))
        raise
    try:
        cluster = merge_reports(joins)
        if measure_links:
            cluster, _ = measure_cluster_links(pool, joins, cluster, activation_bytes)
        return cluster, joins
    except BaseException as exc:
        refuse(pool, joins, str(exc))
        raise


def refuse(pool: WorkerPool, joins: dict[int, JoinReport], message: str) -> None:
    """Tell joined workers they will not be used (they exit with ``message``)."""
    heard = {rank: report.incarnation for rank, report in joins.items()}
    pool.plane.expect(0, heard)  # each answers "heard you" as command 0
    for rank, report in joins.items():
        no = Assignment(incarnation=report.incarnation, model="", dtype="float32", batch=1, context=1, stages=(),
                        gen=0, data_rank=rank - 1, data_world=max(pool.count, rank), backend="gloo", prev_rank=-1,
                        next_rank=-1, first_seq=1, timeout_s=1.0, refused=(message or "the coordinator gave up")[:60_000])
        pool.plane.send([(rank, report.incarnation)], no)
    pool.plane.wait(lambda: len(pool.plane.acks(0)) == len(heard), 5.0)  # keep the plane up until they read it
    pool.close(grace_s=1.0)


def start_workers(pool: WorkerPool, config: ModelConfig, model: str, specs: list[StageSpec], dtype: torch.dtype,
                  context: int, cluster: ClusterTopology | None = None, joins: dict[int, JoinReport] | None = None,
                  join_timeout_s: float = 60.0, load_timeout_s: float = 600.0, rejoin: bool = True,
                  cuda_graphs: bool = True, batch: int = 1, kv_blocks: int | None = None,
                  snapshots: int = 0, packed_tokens: int = 0) -> DistributedPipeline:
    """Start (local: spawn) the workers, assign the stages and return the running pipeline. Every
    stage holds ``batch`` state rows (sequence slots) over a KV pool of ``kv_blocks`` blocks (default:
    every row its whole ``context``) and ``snapshots`` prefix-snapshot entries, and replays packed steps of
    up to ``packed_tokens`` tokens as graphs (with ``cuda_graphs``), as the same stages in this process would.

    Raises :class:`WorkerNotJoined` when a worker does not join or load in time (every worker
    is stopped first)."""
    if cluster is None:  # local: one worker per stage
        pool.count = len(specs)
        owners = [spec.index + 1 for spec in specs]
        for rank in owners:
            pool.spawn(rank)
    else:
        owners = stage_owners([s.device for s in specs], cluster.owners)
    pipeline = DistributedPipeline(pool, config, model, specs, owners, dtype, batch, context, pool.timeout_s,
                                   load_timeout_s, respawn=pool.mode.spawned, rejoin=rejoin, cuda_graphs=cuda_graphs,
                                   kv_blocks=kv_blocks, snapshots=snapshots, packed_tokens=packed_tokens)
    pipeline.start(joins, join_timeout_s)
    return pipeline
