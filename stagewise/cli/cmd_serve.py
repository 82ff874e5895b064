"""``stagewise serve [MODEL]``: the OpenAI-compatible HTTP server."""

from __future__ import annotations

import argparse
import os
from typing import Any

from stagewise.engine.chat_template import template_kwargs_from_json
from stagewise.engine.load_settings import add_model_arguments, load_settings_from_args
from stagewise.engine.reasoning_stream import REASONING_FORMATS
from stagewise.server.serve_settings import DEFAULT_MAX_BODY_BYTES, ServeSettings

FAULT_INJECTION_ENV = "STAGEWISE_FAULT_INJECTION"
API_KEY_ENV = "STAGEWISE_API_KEY"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API",
                                   description="Serve a model over an OpenAI-compatible HTTP API.")
    parser.add_argument("model", nargs="?", default=None,
                        help="model directory, GGUF file or random:PRESET (default: the embedded demo model)")
    add_model_arguments(parser)
    parser.add_argument("--served-model-name", dest="served_model_names", action="append", default=[], metavar="NAME",
                        help="the model's name in the API (/v1/models, responses); repeatable: later names are "
                             "aliases (default: the model's name, the path given and its last part)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: local only)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument("--api-key", default=None,
                        help=f"require 'Authorization: Bearer KEY' on /v1 (default: ${API_KEY_ENV} if set)")
    parser.add_argument("--max-seqs", default="auto", type=_max_seqs, metavar="N|auto",
                        help="sequences decoded together (continuous batching), each with --context positions of "
                             "state on every stage; auto (default): the most of 64, 32, 16, 8, 4, 2, 1 that fit on as many "
                             "devices as one sequence needs")
    parser.add_argument("--queue", type=int, default=16, help="requests that may wait beyond --max-seqs before 429 (default 16)")
    parser.add_argument("--grace-s", type=float, default=30.0,
                        help="on SIGTERM/SIGINT, seconds to let in-flight requests finish (default 30)")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help="request body size limit (default 4 MiB)")
    parser.add_argument("--no-warmup", dest="warm_up", action="store_false",
                        help="report ready right after loading, without the GPU warm-up (the first requests "
                             "then compile kernels and capture CUDA graphs)")
    parser.add_argument("--no-peak-check", dest="peak_check", action="store_false",
                        help="warm up without the load check's full-context step (a prompt filling --context in "
                             "whole prefill chunks, whose allocator peak is the measured workspace on the banner "
                             "and the status page); the workspace is then reported as not measured")
    parser.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                        help="prefill every prompt whole: no sharing of cached prompt prefixes' KV blocks")
    parser.add_argument("--cors-origin", dest="cors_origins", action="append", default=[], metavar="ORIGIN",
                        help="allow browser pages from ORIGIN (e.g. http://localhost:3000, or '*') to call the "
                             "API; repeatable (default: no CORS headers)")
    parser.add_argument("--header-timeout-s", type=float, default=10.0,
                        help="close a connection whose request headers are not complete within this many seconds "
                             "of connecting or of its last response (default 10)")
    parser.add_argument("--body-timeout-s", type=float, default=30.0,
                        help="answer 408 and close the connection when a request body is not complete within this "
                             "many seconds of the server beginning to read it (default 30)")
    parser.add_argument("--keep-alive-s", type=int, default=5,
                        help="close an idle keep-alive connection after this many seconds (default 5)")
    parser.add_argument("--max-connections", type=int, default=1024,
                        help="open connections before new requests are refused with 503 (default 1024)")
    parser.add_argument("--step-timeout-s", type=float, default=120.0,
                        help="stop and replace the engine process when it sends nothing for this many seconds (a "
                             "step that never ends; its requests get 503 engine_died) (default 120)")
    parser.add_argument("--reasoning-format", choices=REASONING_FORMATS, default="auto",
                        help="auto (default): a thinking model's <think> block is returned apart, as "
                             "reasoning_content (and reasoning), not in content; none: left in the content")
    parser.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                        help="template variables for every chat request, under each request's own "
                             "chat_template_kwargs (e.g. '{\"enable_thinking\": false}')")
    parser.add_argument("--no-webui", dest="webui", action="store_false",
                        help="serve no web page at / (the API, /v1/stagewise/status included, is served as ever)")
    parser.set_defaults(func=run)


def settings_from_args(args: argparse.Namespace) -> ServeSettings:
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    return ServeSettings(
        load=load_settings_from_args(args),
        host=args.host, port=args.port, api_key=api_key, queue=args.queue, grace_s=args.grace_s,
        max_body_bytes=args.max_body_bytes, fault_injection=os.environ.get(FAULT_INJECTION_ENV) == "1",
        warm_up=args.warm_up, peak_check=args.peak_check, prefix_cache=args.prefix_cache,
        cors_origins=tuple(args.cors_origins), header_timeout_s=args.header_timeout_s,
        body_timeout_s=args.body_timeout_s,
        keep_alive_s=args.keep_alive_s, max_connections=args.max_connections, webui=args.webui,
        step_timeout_s=args.step_timeout_s,
        served_model_names=tuple(args.served_model_names),
        reasoning_format=args.reasoning_format,
        chat_template_kwargs=template_kwargs_from_json(args.chat_template_kwargs),
    )


def _max_seqs(value: str) -> int | None:
    if value == "auto":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or auto, got {value!r}") from None


def run(args: argparse.Namespace) -> int:
    from stagewise.server.runner import serve  # heavy imports only when serving

    return serve(settings_from_args(args))
