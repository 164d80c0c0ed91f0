"""Sampling parameters per request and the sampler (docs/serving.md, "Sampling")."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


class BadParameter(ValueError):
    """A sampling parameter out of its range; ``param`` names it (HTTP 400)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    #: 0 is greedy (argmax); otherwise logits are divided by it before softmax
    temperature: float = 1.0
    top_p: float = 1.0
    #: -1 (or 0): all tokens
    top_k: int = -1
    #: a generator of its own per request: the same seed, the same tokens, whatever the batch
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    #: do not stop at the tokenizer's end-of-sequence token
    ignore_eos: bool = False
    extra: dict[str, object] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise BadParameter("max_tokens", f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not _number(self.temperature) or not 0 <= self.temperature <= 100:
            raise BadParameter("temperature", f"temperature must be in [0, 100], got {self.temperature!r}")
        if not _number(self.top_p) or not 0 < self.top_p <= 1:
            raise BadParameter("top_p", f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < -1:
            raise BadParameter("top_k", f"top_k must be -1 (all) or a positive integer, got {self.top_k!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise BadParameter("seed", f"seed must be an integer, got {self.seed!r}")
        if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in self.stop_token_ids):
            raise BadParameter(
                "stop_token_ids", f"stop_token_ids must be token ids, got {list(self.stop_token_ids)!r}"
            )
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise BadParameter("stop", f"stop must be non-empty strings, got {list(self.stop)!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token from ``logits`` ``[vocab]`` (float32)."""
    if params.greedy:
        return int(torch.argmax(logits))
    logits = logits.float() / params.temperature
    if 0 < params.top_k < logits.numel():
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # keep the smallest prefix whose mass reaches top_p (the first token always)
        drop = probs.cumsum(-1) - probs >= params.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(0, order, sorted_logits)
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


__all__ = ["BadParameter", "SamplingParams", "sample"]
