"""Converters between the engine's objects and the engine-process messages' records, both ways.

Each ``*_of`` function rebuilds a domain object from a decoded record and runs that object's own checks
(a :class:`RequestOutput`'s finish reason, an :class:`EngineRequest`'s limits); a record that fails them
raises :class:`EngineMessageRejected` (from the API side) or the request's own typed error (engine side).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from prometheus_client import Metric
from prometheus_client.samples import Sample
from tokenizers import Tokenizer as BackendTokenizer

from stagewise.engine.chat_template import ChatTemplate
from stagewise.engine.grammar import Grammar
from stagewise.engine.grammar_vocabulary import GrammarVocabulary
from stagewise.engine.request import EngineRequest
from stagewise.engine.request_output import RequestOutput, TokenLogprob
from stagewise.engine.sampling_params import SamplingParams
from stagewise.engine.tokenizer import Tokenizer
from stagewise.errors import EngineMessageRejected
from stagewise.server.engine_messages import (
    FamilyRecord,
    GrammarRecord,
    LogprobRecord,
    ModelRecord,
    OutputRecord,
    SampleRecord,
    SamplingRecord,
    Submit,
    TokenizerRecord,
)
from stagewise.server.message_codec import error_of, error_record
from stagewise.server.model_facts import ModelFacts


def submit_of(key: int, request: EngineRequest) -> Submit:
    s = request.sampling
    grammar = GrammarRecord(s.grammar.definition, s.grammar.description) if s.grammar is not None else None
    sampling = SamplingRecord(s.temperature, s.top_p, s.top_k, s.min_p, s.presence_penalty, s.frequency_penalty,
                              s.seed, s.logit_bias, grammar)
    return Submit(key, request.request_id, request.prompt_ids, request.max_tokens, sampling, request.stop,
                  tuple(sorted(request.stop_token_ids)), request.logprobs, request.top_logprobs)


def request_of(submit: Submit, vocabulary: GrammarVocabulary | None) -> EngineRequest:
    """The engine request ``submit`` carries; its grammar recompiled over ``vocabulary`` (this process's).

    Raises the request's typed error (``RequestError``, ``GrammarError``) when a field is out of range."""
    s = submit.sampling
    grammar = None
    if s.grammar is not None:
        if vocabulary is None:
            raise EngineMessageRejected(f"request {submit.request_id} carries a grammar; this model has no vocabulary")
        grammar = Grammar(s.grammar.definition, s.grammar.description, vocabulary)
    sampling = SamplingParams(s.temperature, s.top_p, s.top_k, s.min_p, s.presence_penalty, s.frequency_penalty,
                              s.seed, s.logit_bias, grammar)
    return EngineRequest(submit.request_id, submit.prompt_ids, submit.max_tokens, sampling, submit.stop,
                         frozenset(submit.stop_token_ids), submit.logprobs, submit.top_logprobs)


def output_record(key: int, output: RequestOutput) -> OutputRecord:
    logprobs = tuple(LogprobRecord(lp.token, lp.logprob, lp.bytes, lp.top) for lp in output.logprobs)
    error = error_record(output.error) if output.error is not None else None
    return OutputRecord(key, output.text, output.prompt_tokens, output.completion_tokens, logprobs,
                        output.finish_reason, error, output.cached_tokens, output.stop_string)


def output_of(record: OutputRecord) -> RequestOutput:
    logprobs = tuple(TokenLogprob(lp.token, lp.logprob, lp.bytes, lp.top) for lp in record.logprobs)
    try:
        return RequestOutput(record.text, record.prompt_tokens, record.completion_tokens, logprobs,
                             record.finish_reason, error_of(record.error) if record.error is not None else None,
                             record.cached_tokens, record.stop_string)
    except ValueError as exc:
        raise EngineMessageRejected(f"engine output for request key {record.key} is inconsistent: {exc}") from exc


def model_record(facts: ModelFacts) -> ModelRecord:
    tok = facts.tokenizer
    tokenizer = TokenizerRecord(tok.backend.to_str(), tok.bos_token_id, tok.eos_token_id, tuple(sorted(tok.eos_token_ids)),
                                tok.pad_token_id, tok.unk_token_id, tok.chat_template)
    return ModelRecord(facts.name, facts.vocab_size, facts.max_context, tuple(sorted(facts.stop_token_ids)), tokenizer,
                       facts.chat_template.source, facts.stages, facts.slots, json.dumps(facts.placement))


def facts_of(record: ModelRecord) -> ModelFacts:
    t = record.tokenizer
    try:
        tokenizer = Tokenizer(BackendTokenizer.from_str(t.backend_json), bos_token_id=t.bos_token_id,
                              eos_token_id=t.eos_token_id, eos_token_ids=t.eos_token_ids, pad_token_id=t.pad_token_id,
                              unk_token_id=t.unk_token_id, chat_template=t.chat_template)
        return ModelFacts(record.name, record.vocab_size, record.max_context, frozenset(record.stop_token_ids),
                          tokenizer, ChatTemplate(record.chat_template), record.stages, record.slots,
                          json.loads(record.placement_json))
    except Exception as exc:  # the tokenizers library's and json's own error types
        raise EngineMessageRejected(f"the engine's model description does not load: {exc}") from exc


def family_records(families: Iterable[Metric]) -> tuple[FamilyRecord, ...]:
    return tuple(FamilyRecord(f.name, f.documentation, f.type,
                              tuple(SampleRecord(s.name, dict(s.labels), float(s.value)) for s in f.samples))
                 for f in families)


def families_of(records: Iterable[FamilyRecord]) -> list[Metric]:
    out = []
    for record in records:
        family = Metric(record.name, record.documentation, record.type)
        family.samples = [Sample(s.name, s.labels, s.value) for s in record.samples]
        out.append(family)
    return out
