"""``stagewise chat [MODEL]``: chat in the terminal with a model loaded in-process.

Reads one user message per stdin line (interactive or piped), streams the reply, keeps the
conversation. ``/reset`` forgets it, ``/exit`` (or end of input) quits. Ctrl-C during a reply
cancels that reply only. A thinking model's reasoning (its ``<think>`` block) streams dimmed to stderr and the
answer to stdout, so a pipe gets the answer alone (``--reasoning-format none``: both to stdout, as written).
"""

from __future__ import annotations

import argparse
import queue
import sys
import uuid
from typing import Any

from stagewise.engine.load_settings import add_model_arguments
from stagewise.engine.reasoning_stream import REASONING_FORMATS

HELP = "commands: /reset (forget the conversation), /exit (quit)"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("chat", help="chat with a model in the terminal",
                                   description="Chat with a model in the terminal (loads it in-process).")
    parser.add_argument("model", nargs="?", default=None,
                        help="model directory, GGUF file or random:PRESET (default: the embedded demo model)")
    add_model_arguments(parser)
    parser.add_argument("--system", default=None, help="system message")
    parser.add_argument("--max-tokens", type=int, default=512, help="max tokens per reply (default 512)")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                        help="template variables for every turn (e.g. '{\"enable_thinking\": false}')")
    parser.add_argument("--reasoning-format", choices=REASONING_FORMATS, default="auto",
                        help="auto (default): a thinking model's reasoning dimmed on stderr, the answer on stdout; "
                             "none: the output as written, on stdout")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stagewise.console import console as make_console
    from stagewise.engine.chat_template import template_kwargs_from_json
    from stagewise.engine.engine import Engine
    from stagewise.engine.model_loading import load_model_from_args
    from stagewise.server.load_display import placement_lines

    err = make_console(stderr=True)
    variables = template_kwargs_from_json(args.chat_template_kwargs)  # a mistake is one line, before loading
    model = load_model_from_args(args)
    if model.tokenizer is None and (args.model or "").startswith("random:"):
        from stagewise.server.random_tokenizer import with_demo_tokenizer

        model = with_demo_tokenizer(model)  # as serve attaches it: random weights come without a tokenizer
    engine = Engine(model).start()
    try:
        for line in placement_lines(model):
            err.print(line, highlight=False, soft_wrap=True)
        err.print(f"Chatting with {model.name}. {HELP}", highlight=False)
        return _loop(args, engine, err, variables)
    finally:
        engine.stop()
        model.close()


def _fit(model: Any, tokenizer: Any, system: list[dict[str, str]], history: list[dict[str, str]],
         max_tokens: int, err: Any, variables: dict[str, Any]) -> tuple[str, list[int]]:
    """The prompt (text, ids) of the conversation, dropping its oldest turns (in place) until the prompt leaves
    room for a reply: ``max_tokens`` or a quarter of the context, whichever is less. Raises
    :class:`ContextLengthExceeded` when the newest message alone leaves no such room."""
    from stagewise.errors import ContextLengthExceeded

    room = max(1, min(max_tokens, model.max_context // 4))  # tokens a reply may take at least
    dropped = 0
    while True:
        prompt = model.chat_template.render([*system, *history], add_generation_prompt=True,
                                            special_tokens=tokenizer.special_tokens_map, **variables)
        ids: list[int] = tokenizer.encode(prompt)
        if len(ids) + room <= model.max_context:
            break
        if len(history) <= 1:
            raise ContextLengthExceeded(f"the message takes {len(ids)} tokens; with {room} for the reply that is "
                                        f"past the {model.max_context}-token context (--context)")
        del history[:2]  # the oldest user message and the reply to it
        dropped += 1
    if dropped:
        err.print(f"(dropped the {dropped} oldest turn{'s' if dropped > 1 else ''} to fit the "
                  f"{model.max_context}-token context)", highlight=False)
    return prompt, ids


def _loop(args: argparse.Namespace, engine: Any, err: Any, variables: dict[str, Any]) -> int:
    from stagewise.engine.reasoning_stream import ReasoningStream, has_reasoning_tags, starts_in_reasoning
    from stagewise.engine.request import EngineRequest
    from stagewise.engine.request_output import RequestOutput
    from stagewise.engine.sampling_params import SamplingParams
    from stagewise.errors import StagewiseError

    model = engine.model
    tokenizer = engine.tokenizer
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    system = [{"role": "system", "content": args.system}] if args.system else []
    history: list[dict[str, str]] = []
    interactive = sys.stdin.isatty()
    thinking = args.reasoning_format == "auto" and has_reasoning_tags(model.chat_template.source)
    while True:
        if interactive:
            print("> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            return 0
        text = line.strip()
        if not text:
            continue
        if text == "/exit":
            return 0
        if text == "/reset":
            history.clear()
            err.print("(conversation reset)")
            continue
        if text.startswith("/"):
            err.print(f"unknown command {text!r}; {HELP}", highlight=False)
            continue
        history.append({"role": "user", "content": text})
        try:
            prompt, ids = _fit(model, tokenizer, system, history, args.max_tokens, err, variables)
            budget = min(args.max_tokens, model.max_context - len(ids))
            request = EngineRequest(f"chat-{uuid.uuid4().hex[:12]}", tuple(ids), max(budget, 1), sampling,
                                    stop_token_ids=engine.stop_token_ids)
            outputs: queue.Queue[RequestOutput] = queue.Queue()
            handle = engine.submit(request, outputs.put)
        except StagewiseError as exc:
            if history:
                history.pop()
            err.print(f"error: {exc}", highlight=False, soft_wrap=True)
            continue
        reply: list[str] = []
        thought: list[str] = []
        split = ReasoningStream(starts_in_reasoning(prompt)) if thinking else None
        try:
            while True:
                out = outputs.get()
                pieces = [] if split is None else split.push(out.text) + (split.finish() if out.finished else [])
                for piece in pieces:
                    if piece.reasoning:
                        err.print(piece.text, style="dim", end="", highlight=False, markup=False, soft_wrap=True)
                        thought.append(piece.text)
                    else:
                        if thought and not reply:
                            err.print()  # the reasoning's line ends before the answer
                        print(piece.text, end="", flush=True)
                        reply.append(piece.text)
                if split is None:
                    print(out.text, end="", flush=True)
                    reply.append(out.text)
                if out.finished:
                    break
        except KeyboardInterrupt:
            handle.cancel()
            handle.wait()
            out = RequestOutput("", 0, 0, finish_reason="cancelled")
        print(flush=True)
        if out.finish_reason == "error":
            err.print(f"error: {out.error}", highlight=False)
        if out.finish_reason in ("error", "cancelled"):
            history.pop()
            continue
        answer = {"role": "assistant", "content": "".join(reply)}
        if thought:
            answer["reasoning_content"] = "".join(thought)  # the template decides whether to keep it
        history.append(answer)
