"""A thinking model's reasoning returned apart through the HTTP API (``reasoning_content``, as llama-server's
default ``--reasoning-format`` and vLLM's reasoning parsers), and ``chat_template_kwargs`` reaching the template.

The model's template is Qwen3.6's shape: the generation prompt opens ``<think>`` unless ``enable_thinking`` is
false, which writes an empty block instead. A scripted sampler stands in for the model's choices
(:mod:`tests.test_server_tool_calls`); the rest (template, engine, detokenizer, the split, the openai client) is real.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from openai import OpenAI

from stagewise.cli.main import main
from stagewise.engine.loaded_model import LoadedModel
from stagewise.server.serve_settings import ServeSettings
from tests.test_server_support import templated_model
from tests.test_server_tool_calls import TOOLS, ScriptedBatcher, scripted_server

THINKING_TEMPLATE = (  # written as Qwen's are: every newline a string literal, so trim_blocks keeps them
    "{%- if reasoning_effort is defined %}{{- 'Reasoning: ' + reasoning_effort + '\\n' }}{%- endif %}"
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.role == 'assistant' and m.reasoning_content %}"
    "{{- '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- m.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if tools %}{{- '<tools>' }}{%- for t in tools %}{{- t.function.name }}{%- endfor %}{{- '</tools>' }}{%- endif %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)
THOUGHT = "The user asks for the capital.\nIt is Paris.\n</think>\n\n"
ASK = [{"role": "user", "content": "Capital of France?"}]


@pytest.fixture(scope="module")
def thinking(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoadedModel]:
    """A model whose template is :data:`THINKING_TEMPLATE` (also the Anthropic and Responses tests')."""
    yield from templated_model(tmp_path_factory, "thinking-model", THINKING_TEMPLATE)


@pytest.fixture
def served(thinking: LoadedModel, request: pytest.FixtureRequest) -> Iterator[tuple[OpenAI, ScriptedBatcher]]:
    text, settings = getattr(request, "param", (THOUGHT + "Paris.", ServeSettings()))
    yield from scripted_server(thinking, settings, text)


def _extra(obj: object, key: str) -> object:
    return (getattr(obj, "model_extra", None) or {}).get(key)


def test_reasoning_apart_from_the_answer(served: tuple[OpenAI, ScriptedBatcher]) -> None:
    client, scripted = served
    message = client.chat.completions.create(model="m", messages=ASK).choices[0].message  # type: ignore[arg-type]
    assert message.content == "Paris."
    assert _extra(message, "reasoning_content") == _extra(message, "reasoning") == "The user asks for the capital.\nIt is Paris."
    assert scripted.last_prompt().endswith("<|im_start|>assistant\n<think>\n")


def test_streamed_reasoning_is_the_same_split(served: tuple[OpenAI, ScriptedBatcher]) -> None:
    client, scripted = served
    chunks = list(client.chat.completions.create(model="m", messages=ASK, stream=True, logprobs=True))  # type: ignore[arg-type]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    thought = [str(_extra(d, "reasoning_content")) for d in deltas if _extra(d, "reasoning_content")]
    answer = [d.content for d in deltas if d.content]
    assert len(thought) > 1 and "".join(thought) == "The user asks for the capital.\nIt is Paris."
    assert "".join(answer) == "Paris."
    assert not any("think>" in (d.content or "") for d in deltas)
    last_reasoning = max(i for i, d in enumerate(deltas) if _extra(d, "reasoning_content"))
    assert all(not d.content for d in deltas[:last_reasoning])  # reasoning first, then the answer
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content or []]
    assert len(tokens) == len(scripted.ids)  # every token's logprob is sent, reasoning's too
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_enable_thinking_false_reaches_the_template(served: tuple[OpenAI, ScriptedBatcher]) -> None:
    client, scripted = served
    scripted.ids = [*scripted.tokenizer.encode("Paris."), scripted.ids[-1]]
    reply = client.chat.completions.create(model="m", messages=ASK,  # type: ignore[arg-type]
                                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert scripted.last_prompt().endswith("<think>\n\n</think>\n\n")
    assert reply.choices[0].message.content == "Paris." and _extra(reply.choices[0].message, "reasoning_content") is None


def test_reasoning_effort_reaches_the_template(served: tuple[OpenAI, ScriptedBatcher]) -> None:
    client, scripted = served
    client.chat.completions.create(model="m", messages=ASK, max_tokens=1, reasoning_effort="low")  # type: ignore[arg-type]
    assert scripted.last_prompt().startswith("Reasoning: low\n")
    client.responses.create(model="m", input="Capital?", max_output_tokens=1, reasoning={"effort": "high"})
    assert scripted.last_prompt().startswith("Reasoning: high\n")
    client.chat.completions.create(model="m", messages=ASK, max_tokens=1)  # type: ignore[arg-type]
    assert scripted.last_prompt().startswith("<|im_start|>")


def test_reasoning_sent_back_renders_in_the_history(served: tuple[OpenAI, ScriptedBatcher]) -> None:
    client, scripted = served
    history = [*ASK, {"role": "assistant", "content": "Paris.", "reasoning_content": "Easy."},
               {"role": "user", "content": "And Spain?"}]
    client.chat.completions.create(model="m", messages=history)  # type: ignore[arg-type]
    assert "<think>\nEasy.\n</think>\n\nParis." in scripted.last_prompt()


@pytest.mark.parametrize("served", [(THOUGHT + "Paris.", ServeSettings(reasoning_format="none"))], indirect=True)
def test_reasoning_format_none_leaves_the_text(served: tuple[OpenAI, ScriptedBatcher]) -> None:
    client, _ = served
    message = client.chat.completions.create(model="m", messages=ASK).choices[0].message  # type: ignore[arg-type]
    assert message.content == THOUGHT + "Paris." and _extra(message, "reasoning_content") is None


@pytest.mark.parametrize("served", [(
    THOUGHT + '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    ServeSettings(chat_template_kwargs={"enable_thinking": True}))], indirect=True)
def test_tool_call_after_reasoning(served: tuple[OpenAI, ScriptedBatcher]) -> None:
    client, scripted = served
    reply = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS)  # type: ignore[arg-type]
    assert "<tools>get_weather</tools>" in scripted.last_prompt()
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and _extra(choice.message, "reasoning_content")
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"city": "Paris"}  # type: ignore[index, union-attr]
    chunks = list(client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, stream=True))  # type: ignore[arg-type]
    calls = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    assert [c.function.name for c in calls if c.id] == ["get_weather"]  # type: ignore[union-attr]
    assert not any("think>" in (ch.delta.content or "") for c in chunks for ch in c.choices)


@pytest.mark.parametrize("served", [(THOUGHT, ServeSettings(chat_template_kwargs={"enable_thinking": False}))],
                         indirect=True)
def test_server_default_template_kwargs_under_the_request(served: tuple[OpenAI, ScriptedBatcher]) -> None:
    client, scripted = served
    client.chat.completions.create(model="m", messages=ASK, max_tokens=2)  # type: ignore[arg-type]
    assert scripted.last_prompt().endswith("<think>\n\n</think>\n\n")  # the server's default
    client.chat.completions.create(model="m", messages=ASK, max_tokens=2,  # type: ignore[arg-type]
                                   extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert scripted.last_prompt().endswith("assistant\n<think>\n")  # the request's, over it
    tokens = client.post("http://testserver/tokenize", body={"messages": ASK}, cast_to=object)
    rendered = scripted.tokenizer.decode(tokens["tokens"], skip_special_tokens=False)  # type: ignore[index]
    assert rendered.endswith("<think>\n\n</think>\n\n")  # /tokenize renders as chat does


def test_json_output_is_not_split(served: tuple[OpenAI, ScriptedBatcher]) -> None:
    client, scripted = served
    scripted.ids = [*scripted.tokenizer.encode('{"a": 1}'), scripted.ids[-1]]
    reply = client.chat.completions.create(model="m", messages=ASK,  # type: ignore[arg-type]
                                           response_format={"type": "json_object"})
    assert reply.choices[0].message.content == '{"a": 1}' and _extra(reply.choices[0].message, "reasoning_content") is None


def test_template_kwargs_that_set_the_requests_own_fields_are_refused(served: tuple[OpenAI, ScriptedBatcher]) -> None:
    client, _ = served
    import openai

    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", messages=ASK,  # type: ignore[arg-type]
                                       extra_body={"chat_template_kwargs": {"messages": []}})
    assert caught.value.body["param"] == "chat_template_kwargs"  # type: ignore[index]
    assert client.chat.completions.create(model="m", messages=ASK, max_tokens=1).choices  # type: ignore[arg-type]


@pytest.mark.parametrize(("flag", "says"), [("{", "is not JSON"), ("[1]", "must be a JSON object"),
                                            ('{"tools": 1}', "cannot set 'tools'")])
def test_serve_refuses_bad_template_kwargs(flag: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "random:tiny-llama", "--devices", "cpu:1x1GiB", "--chat-template-kwargs", flag]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--chat-template-kwargs" in err and says in err
