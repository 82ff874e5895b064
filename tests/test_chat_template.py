"""ChatTemplate renders exactly what transformers' apply_chat_template renders."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from stagewise.engine.chat_template import ChatTemplate
from stagewise.errors import ConfigError, RequestError
from stagewise.weights.chatml_template import DEFAULT_CHATML
from stagewise.weights.tokenizer_train import train_demo_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Météo actuelle d'une ville — current weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "now", "description": "Current time", "parameters": {}}},
]
CALLS: list[dict[str, Any]] = [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}},
    {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": {}}},
]
CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "single": [{"role": "user", "content": "Hi there!"}],
    "multi_turn": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 日本?"},
    ],
    "tool_round_trip": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Zürich, and the time?"},
        {"role": "assistant", "content": None, "tool_calls": CALLS},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'},
        {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
        {"role": "assistant", "content": "21 °C at noon."},
        {"role": "user", "content": "Thanks"},
    ],
    "content_and_call": [
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": CALLS[1:]},
        {"role": "tool", "content": "12:00"},
    ],
}


@pytest.fixture(scope="module")
def hf_tokenizer() -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=train_demo_tokenizer(400), eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )


def hf_render(hf: Any, template: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    return str(hf.apply_chat_template(copy.deepcopy(messages), chat_template=template, tokenize=False, **kwargs))


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("with_tools", [False, True])
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_default_chatml_matches_transformers(
    hf_tokenizer: Any, name: str, with_tools: bool, add_generation_prompt: bool
) -> None:
    messages = CONVERSATIONS[name]
    tools = TOOLS if with_tools else None
    expected = hf_render(
        hf_tokenizer, DEFAULT_CHATML, messages, tools=tools, add_generation_prompt=add_generation_prompt
    )
    got = ChatTemplate(None).render(
        messages,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        special_tokens=hf_tokenizer.special_tokens_map,
    )
    assert got == expected


def test_openai_shaped_inputs_render_like_hf_shaped_ones() -> None:
    openai_calls = [
        {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}} for c in CALLS
    ]
    openai = copy.deepcopy(CONVERSATIONS["tool_round_trip"])
    openai[2]["tool_calls"] = openai_calls
    openai[1]["content"] = [{"type": "text", "text": "Weather in Zürich,"}, {"type": "text", "text": "and the time?"}]
    hf_shaped = copy.deepcopy(CONVERSATIONS["tool_round_trip"])
    hf_shaped[1]["content"] = "Weather in Zürich,\nand the time?"
    template = ChatTemplate(None)
    assert template.render(openai, tools=TOOLS) == template.render(hf_shaped, tools=TOOLS)
    assert '"arguments": {"city": "Zürich"}' in template.render(openai)


def test_default_chatml_text_shape() -> None:
    out = ChatTemplate(None).render(CONVERSATIONS["content_and_call"], tools=TOOLS[1:], add_generation_prompt=True)
    assert out.startswith("<|im_start|>system\n# Tools\n")
    assert "<tools>\n" + json.dumps(TOOLS[1], ensure_ascii=False) + "\n</tools>" in out
    assert (
        '<|im_start|>assistant\nLet me check.\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call><|im_end|>'
        in out
    )
    assert out.endswith("<|im_start|>user\n<tool_response>\n12:00\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


EXTRAS_TEMPLATE = (
    "{{ bos_token }}|{{ eos_token }}|{{ data | tojson(indent=2, sort_keys=true) }}|{{ data | tojson }}|"
    "{% if enable_thinking is defined and not enable_thinking %}NO-THINK{% endif %}|"
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
    "{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}|{{ dict(a=1) | tojson }}|"
    "{% for d in documents or [] %}[{{ d.title }}]{% endfor %}|{{ strftime_now('%Y') | length }}"
)


def test_globals_filters_and_extra_variables_match_transformers(hf_tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    data = {"z": "é<>&", "a": [1, 2]}
    docs = [{"title": "T1", "text": "x"}, {"title": "T2", "text": "y"}]
    expected = hf_render(hf_tokenizer, EXTRAS_TEMPLATE, messages, data=data, enable_thinking=False, documents=docs)
    got = ChatTemplate(EXTRAS_TEMPLATE).render(
        messages, data=data, enable_thinking=False, documents=docs, special_tokens=hf_tokenizer.special_tokens_map
    )
    assert got == expected
    assert "é<>&" in got and "NO-THINK" in got


def test_image_part_is_rejected() -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "data:..."}},
            ],
        }
    ]
    with pytest.raises(RequestError, match="image input is not supported"):
        ChatTemplate(None).render(messages)


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [{"content": "no role"}],
        [{"role": "user", "content": [{"type": "input_audio"}]}],
        [{"role": "user", "content": 42}],
        [{"role": "wizard", "content": "x"}],
    ],
)
def test_bad_messages_raise_request_error(messages: list[dict[str, Any]]) -> None:
    with pytest.raises(RequestError):
        ChatTemplate(None).render(messages)


def test_template_errors() -> None:
    with pytest.raises(ConfigError, match="does not parse"):
        ChatTemplate("{% if %}")
    with pytest.raises(RequestError, match="roles must alternate"):
        ChatTemplate("{{ raise_exception('roles must alternate') }}").render([{"role": "user", "content": "x"}])
    with pytest.raises(RequestError):
        ChatTemplate("{% set ns = namespace(_x=1) %}").render([{"role": "user", "content": "x"}])
