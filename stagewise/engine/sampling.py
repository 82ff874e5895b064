"""Sampling: temperature, top-k, top-p, min-p, penalties, logit bias, grammars and seeded reproducibility."""

from __future__ import annotations

import math
from collections import Counter

import torch

from stagewise.engine.grammar_state import GrammarState
from stagewise.engine.sample import Sample
from stagewise.engine.sampling_params import SamplingParams
from stagewise.errors import RequestError, StepFailed
from stagewise.runtime.greedy_pairs import greedy_pairs

__all__ = ["Sample", "Sampler", "SamplingParams"]  # the records re-exported: warm-up, benches and tests import them here


def _non_finite() -> StepFailed:
    return StepFailed("the model produced non-finite logits (NaN or inf); nothing was sampled")


class Sampler:
    """Draws tokens for one sequence; a fixed ``seed`` makes the draws reproducible.

    With a grammar, the sampler holds the sequence's :class:`~stagewise.engine.grammar_state.GrammarState`:
    tokens outside it are masked before every draw, and every token drawn (or accepted) advances it.
    """

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.generator = torch.Generator()
        if params.seed is not None:
            self.generator.manual_seed(params.seed)
        else:
            self.generator.seed()
        self.counts: Counter[int] = Counter()
        self.grammar = GrammarState(params.grammar) if params.grammar is not None else None

    def sample(self, logits: torch.Tensor, top_logprobs: int = 0) -> Sample:
        """Choose the next token from ``logits`` ``(V,)`` (float32)."""
        p = self.params
        if self.plain_greedy(top_logprobs):
            # greedy on the logits' own device, by the one greedy formula: two scalars come back to the host
            token, logprob = greedy_pairs(logits[None])[1][0].tolist()
            return self.accept(token, logprob)
        logits = logits.detach().float().cpu()
        if not bool(torch.isfinite(logits).all()):
            raise _non_finite()
        logprobs = torch.log_softmax(logits, dim=-1)
        if self.counts and (p.presence_penalty or p.frequency_penalty):
            ids = torch.tensor(list(self.counts))
            freq = torch.tensor([self.counts[i] for i in self.counts], dtype=torch.float32)
            logits = logits.clone()
            logits[ids] -= p.presence_penalty + p.frequency_penalty * freq
        if p.logit_bias:
            logits = self._biased(logits)
        if self.grammar is not None:
            allowed = self.grammar.allowed()  # (V,) bool
            if allowed.numel() != logits.numel():
                raise StepFailed(f"the grammar covers {allowed.numel()} tokens; the logits have {logits.numel()}")
            logits = logits.masked_fill(~allowed, float("-inf"))
        if p.temperature == 0.0:
            token = int(torch.argmax(logits))
        else:
            token = self._draw(logits / p.temperature)
        self.counts[token] += 1
        if self.grammar is not None:
            self.grammar.advance(token)
        top: tuple[tuple[int, float], ...] = ()
        if top_logprobs:
            values, ids = torch.topk(logprobs, top_logprobs)
            top = tuple((int(i), float(v)) for i, v in zip(ids, values, strict=False))
        return Sample(token, float(logprobs[token]), top)

    def plain_greedy(self, top_logprobs: int = 0) -> bool:
        """Greedy with nothing but the token and its log-probability to report: sampled on the device."""
        p = self.params
        return (p.temperature == 0.0 and not top_logprobs and not (p.presence_penalty or p.frequency_penalty)
                and not p.logit_bias and p.grammar is None)

    def accept(self, token: float, logprob: float) -> Sample:
        """The :class:`Sample` of a (token, log-probability) pair read back from a device greedy sample;
        raises :class:`StepFailed` for non-finite logits (a NaN log-probability)."""
        if not math.isfinite(logprob):
            raise _non_finite()
        self.counts[int(token)] += 1
        if self.grammar is not None:
            self.grammar.advance(int(token))
        return Sample(int(token), float(logprob))

    def _biased(self, logits: torch.Tensor) -> torch.Tensor:
        ids = torch.tensor([token for token, _ in self.params.logit_bias])
        if int(ids.max()) >= logits.numel():
            raise RequestError(f"logit_bias token id {int(ids.max())} is outside the vocabulary (0..{logits.numel() - 1})")
        biased = logits.clone()
        biased[ids] += torch.tensor([bias for _, bias in self.params.logit_bias], dtype=logits.dtype)
        return biased

    def _draw(self, logits: torch.Tensor) -> int:
        p = self.params
        if p.top_k > 0:
            kth = torch.topk(logits, min(p.top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if p.min_p > 0.0:
            probs = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)
        if p.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_probs, 0) - sorted_probs < p.top_p
            mask = torch.zeros_like(probs, dtype=torch.bool)
            mask[order[keep]] = True
            probs = probs * mask
        return int(torch.multinomial(probs / probs.sum(), 1, generator=self.generator))
