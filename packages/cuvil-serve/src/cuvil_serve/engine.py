"""The engine: continuous batching over a paged cache (``Engine``, one step per call, no
threads) and its loop in a background thread with streams per request (``AsyncEngine``);
docs/serving.md."""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import torch

from cuvil_ir.graph_ir.ops.paged import paged_attention
from cuvil_serve.blocks import BlockManager
from cuvil_serve.models import LoadedModel
from cuvil_serve.sampling import BadParameter, SamplingParams, sample
from cuvil_serve.scheduler import Scheduler
from cuvil_serve.sequence import RequestOutput, Sequence, Sink, Status
from cuvil_serve.step import PagedLlama, StepInputs, make_caches, sdpa_paged_attention
from cuvil_serve.tokenizer import IncrementalDecoder

_log = logging.getLogger(__name__)


class PromptTooLong(BadParameter):
    """The prompt (with the tokens asked for) does not fit the context (HTTP 400)."""


class QueueFull(RuntimeError):
    """Too many requests accepted and unfinished (HTTP 429)."""


@dataclass
class EngineConfig:
    num_blocks: int = 256
    block_size: int = 16
    max_tokens_per_step: int = 128
    #: prefill tokens in a step that also decodes (a long chunk delays every running
    #: sequence's next token); None: the whole ``max_tokens_per_step``
    max_prefill_while_decoding: int | None = 32
    max_seqs: int = 64
    #: accepted requests beyond the running ones before add_request raises QueueFull
    max_waiting: int = 256
    prefix_sharing: bool = True
    #: compile the step with cu.compile (one call; every size a symbol)
    compile: bool = False
    #: the eager step's attention: "sdpa" (per sequence, torch's SDPA) or "op" (the paged op's
    #: reference); a compiled step always calls the op
    attention: str = "sdpa"
    target: str | None = None
    #: None: the model's max_position_embeddings (and never more than the cache holds)
    max_model_len: int | None = None


class Engine:
    """Not thread-safe: one thread calls :meth:`add_request`, :meth:`abort` and :meth:`step`
    (``AsyncEngine``'s loop, or a test)."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None) -> None:
        self.config = config = config or EngineConfig()
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.blocks = BlockManager(config.num_blocks, config.block_size, prefix_sharing=config.prefix_sharing)
        self.scheduler = Scheduler(
            self.blocks,
            max_tokens_per_step=config.max_tokens_per_step,
            max_seqs=config.max_seqs,
            max_prefill_while_decoding=config.max_prefill_while_decoding,
        )
        self.max_model_len = min(
            config.max_model_len or loaded.max_model_len,
            loaded.max_model_len,
            config.num_blocks * config.block_size,
        )
        if config.attention not in ("sdpa", "op"):
            raise ValueError(f"attention must be 'sdpa' or 'op', got {config.attention!r}")
        eager_sdpa = config.attention == "sdpa" and not config.compile
        self.paged = PagedLlama(loaded.model, sdpa_paged_attention if eager_sdpa else paged_attention)
        self.key_caches, self.value_caches = make_caches(loaded.model, config.num_blocks, config.block_size)
        self.step_fn: Callable[..., torch.Tensor] = self.paged
        self.compiled: Any = None
        if config.compile:
            import cuvil as cu

            self.compiled = cu.compile(self.paged, target=config.target, dynamic=True, fallback="error")
            self.step_fn = self.compiled
        self._seqs: dict[str, Sequence] = {}
        self._decoders: dict[str, IncrementalDecoder] = {}
        self._ids = itertools.count()
        # metrics (docs/serving.md, /metrics)
        self.finished = Counter[str]()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.steps = 0
        self.step_seconds = 0.0

    # -- requests ----------------------------------------------------------------------------

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raise :class:`BadParameter` / :class:`PromptTooLong` unless the request can run."""
        if not prompt_ids:
            raise BadParameter("prompt", "the prompt is empty")
        vocab = self.tokenizer.vocab_size
        bad = [t for t in prompt_ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab]
        if bad:
            raise BadParameter("prompt", f"token ids must be integers in [0, {vocab}), got {bad[:5]}")
        if len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise PromptTooLong(
                "prompt",
                f"the prompt has {len(prompt_ids)} tokens and max_tokens is {params.max_tokens}: "
                f"{len(prompt_ids) + params.max_tokens} tokens do not fit the context of "
                f"{self.max_model_len} tokens",
            )

    def add_request(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        sink: Sink | None = None,
        request_id: str | None = None,
    ) -> str:
        params = params or SamplingParams()
        self.validate(prompt_ids, params)
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._seqs:
            raise BadParameter("request_id", f"request {request_id!r} is already running")
        generator = None
        if params.seed is not None and not params.greedy:
            generator = torch.Generator().manual_seed(params.seed)
        seq = Sequence(
            request_id,
            list(prompt_ids),
            len(prompt_ids),
            params,
            sink or (lambda out: None),
            generator=generator,
        )
        self._seqs[request_id] = seq
        self._decoders[request_id] = IncrementalDecoder(self.tokenizer)
        self.scheduler.add(seq)
        self.prompt_tokens += len(prompt_ids)
        return request_id

    def abort(self, request_id: str) -> bool:
        """Cancel a request: its blocks are freed now. False if it is not running."""
        seq = self._seqs.get(request_id)
        if seq is None:
            return False
        self._finish(seq, "abort", "")
        return True

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    @property
    def num_unfinished(self) -> int:
        return len(self._seqs)

    # -- the step ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Schedule, run the model once over the batch, sample, stream. Returns the outputs
        given to the sinks."""
        batch = self.scheduler.schedule()
        if not batch.items:
            return []
        inputs = StepInputs.build(batch.items, self.blocks.block_size)
        start = time.perf_counter()
        with torch.no_grad():
            logits = self.step_fn(*inputs.args(self.key_caches, self.value_caches))
        self.step_seconds += time.perf_counter() - start
        self.steps += 1
        # greedy rows take their tokens from one argmax over the batch (one call, not one
        # per row); rows with sampling parameters are sampled one by one
        greedy = logits.argmax(-1).tolist()
        outputs = []
        for row, (seq, n) in enumerate(batch.items):
            seq.num_computed += n
            self.blocks.register_computed(seq.table, seq.token_ids, seq.num_computed)
            if seq.num_computed < len(seq.token_ids):
                continue  # a prefill chunk before the last: no token yet
            token = greedy[row] if seq.params.greedy else sample(logits[row], seq.params, seq.generator)
            out = self._append(seq, token)
            if out is not None:
                outputs.append(out)
        return outputs

    def _append(self, seq: Sequence, token: int) -> RequestOutput | None:
        seq.token_ids.append(token)
        self.generation_tokens += 1
        if seq.first_token_time is None:
            seq.first_token_time = time.monotonic()
        params = seq.params
        reason = None
        if token in params.stop_token_ids or (not params.ignore_eos and token == self.tokenizer.eos_id):
            reason = "stop"
        elif len(seq.output_ids) >= params.max_tokens or len(seq.token_ids) >= self.max_model_len:
            reason = "length"
        decoder = self._decoders[seq.request_id]
        decoder.update(seq.output_ids)
        # the stable text while running, the whole decode at the end ([Note: stable text])
        text = decoder.text if reason is None else self.tokenizer.decode(seq.output_ids)
        if params.stop:
            # a stop string can only begin in text not yet given out, or in the held-back tail
            lo = max(0, len(seq.sent_text) - max(map(len, params.stop)))
            hits = [i for i in (text.find(s, lo) for s in params.stop) if i >= 0]
            if hits:
                text = text[: min(hits)]
                reason = "stop"
        if reason is not None:
            return self._finish(seq, reason, text)
        keep = len(text) - _held_back(text, params.stop)
        delta = text[len(seq.sent_text) : keep] if keep > len(seq.sent_text) else ""
        out = RequestOutput(
            seq.request_id,
            seq.output_ids[seq.sent_tokens :],
            delta,
            num_prompt_tokens=seq.num_prompt,
            num_output_tokens=len(seq.output_ids),
        )
        seq.sent_text += delta
        seq.sent_tokens = len(seq.output_ids)
        _deliver(seq, out)
        return out

    def _finish(self, seq: Sequence, reason: str, text: str, error: str | None = None) -> RequestOutput:
        self.scheduler.remove(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        del self._seqs[seq.request_id]
        del self._decoders[seq.request_id]
        self.finished[reason] += 1
        delta = text[len(seq.sent_text) :] if text.startswith(seq.sent_text) else ""
        out = RequestOutput(
            seq.request_id,
            seq.output_ids[seq.sent_tokens :],
            delta,
            finished=True,
            finish_reason=reason,
            num_prompt_tokens=seq.num_prompt,
            num_output_tokens=len(seq.output_ids),
            error=error,
        )
        seq.sent_text += delta
        seq.sent_tokens = len(seq.output_ids)
        _deliver(seq, out)
        return out

    def fail_all(self, error: str) -> None:
        """Finish every request with ``error`` (the step raised): their blocks are freed."""
        for seq in list(self._seqs.values()):
            self._finish(seq, "error", "", error=error)

    # -- for tests and scripts -----------------------------------------------------------------

    def generate(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[list[int]]:
        """Run ``prompts`` together to the end; each one's output token ids."""
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        results: dict[str, list[int]] = {}

        def sink(out: RequestOutput) -> None:
            results.setdefault(out.request_id, []).extend(out.new_token_ids)

        ids = [self.add_request(prompt, p, sink) for prompt, p in zip(prompts, params_list)]
        while self.has_work():
            self.step()
        return [results.get(i, []) for i in ids]

    def metrics(self) -> dict[str, Any]:
        return {
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "free_blocks": self.blocks.num_free,
            "total_blocks": self.blocks.num_blocks,
            "steps": self.steps,
            "step_seconds": self.step_seconds,
            "preemptions": self.scheduler.num_preemptions,
            "prefix_shared_blocks": self.blocks.shared_hits,
            "prompt_tokens": self.prompt_tokens,
            "generation_tokens": self.generation_tokens,
            "finished": dict(self.finished),
            "compiles": self.compiled.stats.compiles if self.compiled is not None else 0,
            "threads": torch.get_num_threads(),
        }


def _deliver(seq: Sequence, out: RequestOutput) -> None:
    """Give ``out`` to the request's sink; a sink that raises (its client gone, its event
    loop closed) loses the output, never the engine."""
    try:
        seq.sink(out)
    except Exception as e:  # noqa: BLE001
        _log.warning("the sink of %s raised %s: %s", seq.request_id, type(e).__name__, e)


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """The length of the longest end of ``text`` that begins some stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


_STOP = object()


def _put_all(items: list[tuple[asyncio.Queue[RequestOutput], RequestOutput]]) -> None:
    for outputs, out in items:
        outputs.put_nowait(out)


class AsyncEngine:
    """The engine's loop in a background thread. Other threads submit and abort through a
    command queue; the loop thread alone touches the engine's state."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._commands: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._accepted = 0  # accepted and not finished: the queue bound's count
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self._ids = itertools.count()
        #: outputs for asyncio queues, gathered during a step and handed to each event loop
        #: in one call after it (:meth:`queue_sink`); touched by the loop thread only
        self._pending: dict[
            asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[RequestOutput], RequestOutput]]
        ] = {}

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> AsyncEngine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="cuvil-serve-engine", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread is not None:
            self._commands.put(_STOP)
            self._wake.set()
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> AsyncEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def capacity(self) -> int:
        return self.engine.config.max_seqs + self.engine.config.max_waiting

    def submit(
        self, prompt_ids: list[int], params: SamplingParams, sink: Sink, request_id: str | None = None
    ) -> str:
        """Queue a request; raises BadParameter / PromptTooLong / QueueFull at once."""
        self.engine.validate(prompt_ids, params)
        if not self.alive:
            raise RuntimeError("the engine loop is not running")
        with self._lock:
            if self._accepted >= self.capacity:
                raise QueueFull(f"{self._accepted} requests are queued or running (at most {self.capacity})")
            self._accepted += 1
        request_id = request_id or f"req-{next(self._ids)}"

        def counted(out: RequestOutput) -> None:
            if out.finished:
                with self._lock:
                    self._accepted -= 1
            sink(out)

        self._commands.put(("add", prompt_ids, params, counted, request_id))
        self._wake.set()
        return request_id

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))
        self._wake.set()

    def queue_sink(self, loop: asyncio.AbstractEventLoop, outputs: asyncio.Queue[RequestOutput]) -> Sink:
        """A sink that puts a request's outputs on ``outputs``, an asyncio queue of ``loop``.
        The outputs of one step for every queue of a loop reach it in one
        ``call_soon_threadsafe`` (one wake-up of the event loop a step, not one a token)."""

        def sink(out: RequestOutput) -> None:
            self._pending.setdefault(loop, []).append((outputs, out))

        return sink

    def _flush(self) -> None:
        pending, self._pending = self._pending, {}
        for loop, items in pending.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the loop is closed: its clients are gone
                _log.warning("dropped %d outputs for a closed event loop", len(items))

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """The request's outputs as they are produced; leaving early aborts it."""
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue[RequestOutput] = asyncio.Queue()
        rid = self.submit(prompt_ids, params, self.queue_sink(loop, outputs), request_id)
        finished = False
        try:
            while not finished:
                out = await outputs.get()
                finished = out.finished
                yield out
        finally:
            if not finished:
                self.abort(rid)

    def call(self, fn: Callable[[Engine], Any], timeout: float = 30.0) -> Any:
        """Run ``fn(engine)`` in the loop thread (between steps) and return its result."""
        done = threading.Event()
        box: list[Any] = []

        def run(engine: Engine) -> None:
            try:
                box.append(fn(engine))
            finally:
                done.set()

        self._commands.put(("call", run))
        self._wake.set()
        if not done.wait(timeout):
            raise TimeoutError("the engine loop did not answer")
        return box[0] if box else None

    def _run(self) -> None:
        engine = self.engine
        while True:
            self._wake.clear()
            while True:
                try:
                    cmd = self._commands.get_nowait()
                except queue.Empty:
                    break
                if cmd is _STOP:
                    engine.fail_all("the engine stopped")
                    self._flush()
                    return
                if cmd[0] == "add":
                    _, prompt_ids, params, sink, rid = cmd
                    try:
                        engine.add_request(prompt_ids, params, sink, rid)
                    except Exception as e:  # validated before; a duplicate id, say
                        sink(RequestOutput(rid, [], "", True, "error", error=str(e)))
                elif cmd[0] == "abort":
                    engine.abort(cmd[1])
                elif cmd[0] == "call":
                    try:
                        cmd[1](engine)
                    except Exception:  # the caller sees an empty result
                        pass
            if engine.has_work():
                try:
                    engine.step()
                except Exception as e:  # noqa: BLE001 - the loop must outlive a failed step
                    self.error = e
                    engine.fail_all(f"{type(e).__name__}: {e}")
                self._flush()
            else:
                self._flush()
                self._wake.wait(0.5)


__all__ = ["AsyncEngine", "Engine", "EngineConfig", "PromptTooLong", "QueueFull"]
