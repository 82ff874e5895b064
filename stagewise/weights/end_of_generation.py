"""The ids that end a generation, read from a vocabulary as llama.cpp reads them.

A GGUF names one ``eos_token_id`` (and maybe ``eot``/``eom``), but chat models end their turns on
other tokens too: Qwen3 writes ``<|im_end|>`` and its base form ``<|endoftext|>``, Llama 3.1
``<|eot_id|>``, ``<|eom_id|>`` and ``<|end_of_text|>``. llama.cpp (``llama-vocab.cpp``,
``special_eog_ids``) stops on every token whose text is one of :data:`EOG_TEXTS`, on the FIM
pad/repo/file-separator tokens, and on the ``eos``/``eot``/``eom`` ids of the metadata; this module
computes the same set, so a GGUF stops where llama.cpp stops on it. (An HF directory's set comes from
its ``generation_config.json`` instead, as vLLM and transformers read it.)
"""

from __future__ import annotations

from collections.abc import Sequence

# llama.cpp's end-of-generation texts (src/llama-vocab.cpp, "maintain a list of tokens that cause
# end-of-generation"), in its order.
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
})
# FIM tokens llama.cpp also ends on, found by text when the metadata names none (pad, repo, file separator)
FIM_EOG_TEXTS = (
    frozenset({"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}),
    frozenset({"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}),
    frozenset({"<|file_sep|>"}),
)


def end_of_generation_ids(tokens: Sequence[str], named: Sequence[int | None] = (),
                          fim_named: Sequence[int | None] = (None, None, None)) -> frozenset[int]:
    """Every id whose sampling ends a generation.

    Args:
        tokens: the vocabulary's token texts by id.
        named: ids the metadata names as ending (``eos``, ``eot``, ``eom``); ``None`` for absent ones.
        fim_named: the metadata's FIM pad, repo and file-separator ids (``None`` when absent: then found by text).
    Returns:
        The named ids, the ids of :data:`EOG_TEXTS` and the FIM ids, less llama.cpp's two exceptions:
        ``<|end|>`` when ``<|call|>`` or ``<|calls|>`` is there with ``<|return|>`` or ``<|flush|>``
        (gpt-oss and solar-open: a message end, not a turn end), and ``</s>`` beside ``<|tool_response>`` or ``<|plamo:eos|>``.
    """
    by_text: dict[str, int] = {}
    for index, text in enumerate(tokens):
        by_text.setdefault(text, index)
    ids = {i for i in named if i is not None and 0 <= i < len(tokens)}
    ids |= {index for index, text in enumerate(tokens) if text in EOG_TEXTS}
    for given, texts in zip(fim_named, FIM_EOG_TEXTS, strict=True):
        found = given if given is not None else next((by_text[t] for t in sorted(texts) if t in by_text), None)
        if found is not None and 0 <= found < len(tokens):
            ids.add(found)
    texts_in = {tokens[i] for i in ids}
    call = bool(texts_in & {"<|call|>", "<|calls|>"})
    if "<|end|>" in texts_in and call and texts_in & {"<|return|>", "<|flush|>"}:
        ids -= {i for i in ids if tokens[i] == "<|end|>"}
    if "</s>" in texts_in and texts_in & {"<|tool_response>", "<|plamo:eos|>"}:
        ids -= {i for i in ids if tokens[i] == "</s>"}
    return frozenset(ids)
