"""Render chat messages to a prompt string exactly as transformers' ``apply_chat_template`` does.

Same sandboxed jinja2 environment (``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``),
same globals (``raise_exception``, ``strftime_now``, ``dict``, ``namespace``), same ``tojson``
(``ensure_ascii=False``, ``indent``, ``separators``, ``sort_keys``), same variables
(``messages``, ``tools``, ``documents``, ``add_generation_prompt``, the tokenizer's special tokens,
and any extra keyword such as ``enable_thinking``).

Messages are normalized on the way in, as OpenAI-compatible servers do:

* keys whose value is None are dropped (transformers does the same);
* ``content`` given as a list of text parts is joined with ``"\\n"``; any image part raises
  :class:`RequestError` ("image input is not supported"), other non-text parts likewise;
* an assistant ``tool_calls[].function.arguments`` JSON string is parsed to an object, the form
  HF templates expect (left as a string if it is not a JSON object);
* ``reasoning_content`` / ``thinking`` / ``reasoning`` are aliased like transformers does.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from stagewise.errors import ConfigError, RequestError
from stagewise.weights.chatml_template import DEFAULT_CHATML

__all__ = ["ChatTemplate"]


_IMAGE_PART_TYPES = frozenset({"image", "image_url", "input_image"})
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_OWN_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt"})  # set by render's own arguments


def own_variable(variables: Mapping[str, Any]) -> str | None:
    """The first (by name) of ``variables`` that :meth:`ChatTemplate.render` sets from its own arguments (extra
    variables never override those), or None: what callers taking variables from users refuse."""
    return min(_OWN_VARIABLES & variables.keys(), default=None)


class ChatTemplate:
    """A compiled chat template. ``source=None`` selects :data:`DEFAULT_CHATML`."""

    def __init__(self, source: str | None) -> None:
        """Raises ConfigError when the template does not parse."""
        self.source = source if source is not None else DEFAULT_CHATML
        try:
            self._template = _environment().from_string(self.source)
        except jinja2.TemplateSyntaxError as exc:
            raise ConfigError(f"chat template does not parse: line {exc.lineno}: {exc.message}") from exc

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        special_tokens: Mapping[str, str] | None = None,
        **variables: Any,
    ) -> str:
        """The prompt text for ``messages``.

        Args:
            messages: OpenAI-style messages (system/user/assistant/tool).
            add_generation_prompt: append the assistant header so the model answers next.
            tools: OpenAI function tools (``{"type": "function", "function": {...}}``).
            documents: RAG documents (``{"title": ..., "text": ...}``) for templates that read them.
            special_tokens: ``Tokenizer.special_tokens_map`` (``bos_token``, ``eos_token``, ...).
            variables: extra template variables (e.g. ``enable_thinking=False``); they override special tokens,
                never those the arguments above set (:func:`own_variable`).
        Raises:
            RequestError: empty or malformed messages, unsupported content parts, or the template's
                own ``raise_exception`` (e.g. roles that do not alternate).
        """
        if not messages:
            raise RequestError("messages must not be empty")
        context = {
            **dict(special_tokens or {}),
            **variables,
            "messages": [_normalize_message(m, i) for i, m in enumerate(messages)],
            "tools": copy.deepcopy(list(tools)) if tools is not None else None,
            "documents": copy.deepcopy(list(documents)) if documents is not None else None,
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return self._template.render(**context)
        except jinja2.TemplateError as exc:
            detail = (exc.message or "").splitlines()[0] if exc.message else "a template error"
            raise RequestError(f"chat template rejected the messages: {detail}") from exc
        except (TypeError, KeyError, IndexError, ValueError, RecursionError) as exc:
            raise RequestError(f"chat template failed on the messages: {_what_went_wrong(exc)}") from exc


def template_kwargs_from_json(text: str | None, flag: str = "--chat-template-kwargs") -> dict[str, Any]:
    """Template variables given on the command line as a JSON object (``{}`` for None); ConfigError naming
    ``flag`` for text that is not one, or that sets a variable :meth:`ChatTemplate.render` sets itself."""
    if text is None:
        return {}
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{flag} is not JSON: {exc.msg} at character {exc.pos}") from None
    if not isinstance(parsed, dict):
        raise ConfigError(f"{flag} must be a JSON object, got {text!r}")
    check_template_kwargs(parsed, flag)
    return parsed


def check_template_kwargs(variables: Mapping[str, Any], flag: str = "--chat-template-kwargs") -> None:
    """ConfigError naming ``flag`` where configured template ``variables`` set one :meth:`ChatTemplate.render`
    sets itself (:func:`own_variable`)."""
    if (clash := own_variable(variables)) is not None:
        raise ConfigError(f"{flag} cannot set {clash!r}: each request's own fields do")


def _what_went_wrong(exc: Exception) -> str:
    """What a template's Python error says about the request, without the exception's class name."""
    detail = str(exc).splitlines()[0][:200] if str(exc) else ""
    if isinstance(exc, RecursionError):
        return "the messages nest too deep"
    if isinstance(exc, KeyError):
        return f"a field the template needs is missing ({detail})"
    if isinstance(exc, IndexError):
        return "a list is shorter than the template expects"
    if isinstance(exc, TypeError):
        return f"a value has a type the template cannot use ({detail})" if detail else "a value has the wrong type"
    return f"a value the template cannot use ({detail})" if detail else "a value the template cannot use"


def _normalize_message(message: Mapping[str, Any], index: int) -> dict[str, Any]:
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise RequestError(f"messages[{index}] must be an object with a string 'role'")
    out = {key: copy.deepcopy(value) for key, value in message.items() if value is not None}
    if "content" in out:
        out["content"] = _content_text(out["content"], index)
    for call in out.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            try:
                parsed = json.loads(function["arguments"])
            except json.JSONDecodeError:
                continue
            if isinstance(parsed, dict):
                function["arguments"] = parsed
    reasoning = next((out[key] for key in _REASONING_FIELDS if out.get(key) is not None), None)
    if reasoning is not None:
        out = {"thinking": reasoning, **out, "reasoning_content": reasoning}
    return out


def _content_text(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"messages[{index}].content must be a string or a list of content parts")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _IMAGE_PART_TYPES:
            raise RequestError("image input is not supported")
        if kind != "text" or not isinstance(part.get("text"), str):
            raise RequestError(f"messages[{index}].content part of type {kind!r} is not supported")
        texts.append(part["text"])
    return "\n".join(texts)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # NOTE: unlike jinja's own tojson, no HTML escaping: prompts are not HTML.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    # `dict(...)` in templates without exposing the type itself to the sandbox.
    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    # Namespaces refuse underscore names so templates cannot reach CPython internals.
    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set the namespace attribute {name!r}")
