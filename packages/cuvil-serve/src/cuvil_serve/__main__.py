"""``python -m cuvil_serve --model tiny-llama --port 8000``: the OpenAI-compatible server on
one machine (docs/serving.md). The model is built from its config with random weights from
``--seed``; nothing is downloaded."""

from __future__ import annotations

import argparse
import os

from cuvil_serve.models import CONFIGS


def engine_threads(requested: int, cores: int) -> int:
    """The torch threads the engine's step runs on: ``requested``, or for 0 ("auto") every
    core this process may use but one, left to the HTTP server's event loop (its JSON and
    socket work per streamed token) and the OS. On 2 cores the step's parallel regions
    otherwise wait on a thread that shares its core with the event loop: measured on this
    project's 2-core host with 16 clients streaming on loopback, 866-1033 tokens/s with 1
    thread against 487-669 with 2 (docs/serving.md)."""
    if requested < 0:
        raise SystemExit(f"--threads must be 0 (auto) or a positive count, got {requested}")
    return requested or max(1, cores - 1)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m cuvil_serve", description=__doc__)
    p.add_argument("--model", default="tiny-llama", choices=sorted(CONFIGS))
    p.add_argument("--seed", type=int, default=0, help="the random weights' seed")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--num-blocks", type=int, default=512, help="KV cache blocks")
    p.add_argument("--block-size", type=int, default=16, help="tokens per block")
    p.add_argument("--max-tokens-per-step", type=int, default=128, help="the step's token budget")
    p.add_argument(
        "--max-prefill-while-decoding",
        type=int,
        default=32,
        help="prefill tokens in a step that also decodes (0: the whole step budget)",
    )
    p.add_argument("--max-seqs", type=int, default=64, help="sequences per step")
    p.add_argument("--max-waiting", type=int, default=256, help="queued requests before 429")
    p.add_argument("--no-prefix-sharing", action="store_true")
    p.add_argument("--compile", action="store_true", help="compile the step with cu.compile")
    p.add_argument("--target", default=None, help="Cuvil target for --compile (default: the best available)")
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads of the model step (0: auto, every core but one, left to the HTTP server)",
    )
    args = p.parse_args(argv)
    threads = engine_threads(args.threads, len(os.sched_getaffinity(0)))

    import torch
    import uvicorn

    torch.set_num_threads(threads)

    from cuvil_serve.api import build_app
    from cuvil_serve.engine import AsyncEngine, Engine, EngineConfig
    from cuvil_serve.models import build_model

    config = EngineConfig(
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        max_tokens_per_step=args.max_tokens_per_step,
        max_prefill_while_decoding=args.max_prefill_while_decoding or None,
        max_seqs=args.max_seqs,
        max_waiting=args.max_waiting,
        prefix_sharing=not args.no_prefix_sharing,
        compile=args.compile,
        target=args.target,
    )
    engine = AsyncEngine(Engine(build_model(args.model, seed=args.seed), config))
    uvicorn.run(build_app(engine, args.model), host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
