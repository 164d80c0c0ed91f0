"""A request's state in the engine (docs/serving.md, "Request -> Sequence")."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from cuvil_serve.blocks import BlockTable
from cuvil_serve.sampling import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestOutput:
    """What a request's sink receives after each step that produced something for it."""

    request_id: str
    #: the tokens and text produced since the previous output
    new_token_ids: list[int]
    new_text: str
    finished: bool = False
    #: "stop" (eos, stop token or stop string), "length" (max_tokens or the context),
    #: "abort" (cancelled), "error"
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    error: str | None = None


#: what receives a request's outputs (called in the engine thread; its result is ignored)
Sink = Callable[[RequestOutput], object]


@dataclass(eq=False)
class Sequence:
    request_id: str
    token_ids: list[int]
    num_prompt: int
    params: SamplingParams
    sink: Sink
    status: Status = Status.WAITING
    #: tokens whose keys and values are in the cache
    num_computed: int = 0
    table: BlockTable = field(default_factory=BlockTable)
    generator: torch.Generator | None = None
    arrival: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    #: times preempted (recomputed)
    preemptions: int = 0
    #: text given out so far, and text decoded but held back (a stop string may begin there)
    sent_text: str = ""
    sent_tokens: int = 0
    finish_reason: str | None = None

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt :]

    @property
    def num_remaining(self) -> int:
        """Tokens to compute before the next token can be sampled."""
        return len(self.token_ids) - self.num_computed

    @property
    def is_prefill(self) -> bool:
        return self.num_remaining > 1


__all__ = ["RequestOutput", "Sequence", "Sink", "Status"]
