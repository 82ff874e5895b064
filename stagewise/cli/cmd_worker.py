"""``stagewise worker --join HOST:PORT --rank K``: run stages for a coordinator, maybe on another host.

The coordinator is ``stagewise serve MODEL --workers N@HOST:PORT`` (or ``run``/``chat``/``bench``
with the same option). The worker reports its devices, loads only the stages it is assigned,
straight to its devices, and serves steps until the coordinator exits or tells it to. Every
message is signed with the secret it shares with the coordinator (``--secret-file`` or
``$STAGEWISE_WORKER_SECRET``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("worker", help="run pipeline stages for a coordinator (multi-process / multi-host)")
    p.add_argument("--join", required=True, metavar="HOST:PORT", help="the coordinator's address")
    p.add_argument("--rank", required=True, type=int, help="this worker's rank, 1..N (rejoin with the same rank)")
    p.add_argument("--devices", metavar="SPEC", help="devices to offer (default: every device found)")
    p.add_argument("--reserve", help="reserve kept from free memory (see `stagewise devices --help`)")
    p.add_argument("--host-name", default="", help="name this host in the topology (default: its hostname)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to reach the coordinator and per step")
    p.add_argument("--secret-file", metavar="PATH", default=None,
                   help="the secret shared with the coordinator (its --worker-secret-file); default: "
                        "$STAGEWISE_WORKER_SECRET_FILE or $STAGEWISE_WORKER_SECRET")
    p.add_argument("--local", action="store_true", help=argparse.SUPPRESS)  # spawned by a local coordinator
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stagewise.engine.opened_model import open_model_source
    from stagewise.runtime.worker import run_worker
    from stagewise.runtime.worker_secret import require_secret

    secret = require_secret(args.secret_file, "a worker")
    topology: dict[str, Any] = {}
    if not args.local:  # a local coordinator planned already; a remote one plans on what we offer
        from stagewise.hardware.device_spec import resolve_device_spec
        from stagewise.hardware.reserve_policy import ReservePolicy

        topology = resolve_device_spec(args.devices, ReservePolicy.parse(args.reserve)).to_dict()
    code = run_worker(args.join, args.rank, open_model_source, topology, secret, args.timeout, args.host_name)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # NOTE: skip interpreter teardown: the heartbeat thread may be inside a store call
