"""The OpenAI-compatible HTTP API over an :class:`AsyncEngine` (starlette; docs/serving.md).

app = build_app(AsyncEngine(Engine(build_model("tiny-llama"))), "tiny-llama")
uvicorn.run(app, port=8000)          # or: python -m cuvil_serve --model tiny-llama
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from cuvil_serve import protocol
from cuvil_serve.engine import AsyncEngine, Engine, PromptTooLong, QueueFull
from cuvil_serve.protocol import ApiError
from cuvil_serve.sampling import BadParameter
from cuvil_serve.sequence import RequestOutput


class _Api:
    def __init__(self, engine: AsyncEngine, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name
        self.created = int(time.time())
        self.http = Counter[tuple[str, int]]()
        self._lock = threading.Lock()

    def count(self, route: str, status: int) -> None:
        with self._lock:
            self.http[(route, status)] += 1

    # -- routes ------------------------------------------------------------------------------

    async def models(self, request: Request) -> Response:
        self.count("/v1/models", 200)
        card = {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "cuvil"}
        return JSONResponse({"object": "list", "data": [card]})

    async def health(self, request: Request) -> Response:
        ok = self.engine.alive
        self.count("/health", 200 if ok else 503)
        return JSONResponse({"status": "ok" if ok else "engine loop stopped"}, status_code=200 if ok else 503)

    async def metrics(self, request: Request) -> Response:
        self.count("/metrics", 200)
        m = await asyncio.get_running_loop().run_in_executor(None, self.engine.call, Engine.metrics)
        return PlainTextResponse(self._prometheus(m), media_type="text/plain; version=0.0.4")

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    # -- generation --------------------------------------------------------------------------

    async def _generate(self, request: Request, *, chat: bool) -> Response:
        route = "/v1/chat/completions" if chat else "/v1/completions"
        try:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise protocol.bad("body", f"the request body is not JSON: {e}") from None
            engine = self.engine.engine
            parsed = protocol.parse(body, engine.tokenizer, chat=chat, max_model_len=engine.max_model_len)
            if parsed.model != self.model_name:
                raise ApiError(
                    404,
                    f"the model {parsed.model!r} does not exist; this server serves {self.model_name!r}",
                    type="invalid_request_error",
                    param="model",
                    code="model_not_found",
                )
            loop = asyncio.get_running_loop()
            outputs: asyncio.Queue[RequestOutput] = asyncio.Queue()
            try:
                rid = self.engine.submit(
                    parsed.prompt_ids,
                    parsed.params,
                    self.engine.queue_sink(loop, outputs),
                    protocol.new_id("chatcmpl" if chat else "cmpl"),
                )
            except PromptTooLong as e:
                raise ApiError(
                    400, str(e), type="invalid_request_error", param="prompt", code="context_length_exceeded"
                ) from None
            except BadParameter as e:
                raise protocol.bad(e.param, str(e)) from None
            except QueueFull as e:
                raise ApiError(429, f"the server is busy: {e}; retry later", type="server_busy") from None
            except RuntimeError as e:
                raise ApiError(503, str(e), type="server_error") from None
        except ApiError as e:
            self.count(route, e.status)
            return JSONResponse(e.body(), status_code=e.status)
        self.count(route, 200)
        if parsed.stream:
            return StreamingResponse(
                self._sse(rid, outputs, chat),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        return await self._whole(rid, outputs, chat, len(parsed.prompt_ids))

    async def _whole(
        self, rid: str, outputs: asyncio.Queue[RequestOutput], chat: bool, n_prompt: int
    ) -> Response:
        text: list[str] = []
        finished = False
        try:
            while not finished:
                out = await outputs.get()
                text.append(out.new_text)
                finished = out.finished
        finally:
            if not finished:  # the handler was cancelled: the client went away
                self.engine.abort(rid)
        if out.finish_reason == "error":
            return JSONResponse(
                ApiError(500, f"the engine failed: {out.error}", type="server_error").body(), status_code=500
            )
        usage = {
            "prompt_tokens": n_prompt,
            "completion_tokens": out.num_output_tokens,
            "total_tokens": n_prompt + out.num_output_tokens,
        }
        make = protocol.chat_completion if chat else protocol.completion
        return JSONResponse(make(rid, self.model_name, "".join(text), out.finish_reason, usage))

    async def _sse(self, rid: str, outputs: asyncio.Queue[RequestOutput], chat: bool) -> AsyncIterator[str]:
        """Server-sent events in OpenAI's chunk format, ``data: [DONE]`` last. A client that
        disconnects cancels this generator: the request is aborted, its blocks freed."""
        finished = False
        try:
            if chat:
                yield _event(
                    protocol.chat_chunk(rid, self.model_name, {"role": "assistant", "content": ""}, None)
                )
            while not finished:
                out = await outputs.get()
                finished = out.finished
                if out.finish_reason == "error":
                    yield _event(ApiError(500, f"the engine failed: {out.error}", type="server_error").body())
                    break
                reason = out.finish_reason if finished else None
                # one chunk per token, its text possibly empty (held back until it is stable:
                # [Note: stable text]), so a client sees every token when it is made
                if out.new_token_ids or out.new_text or reason:
                    if chat:
                        delta = {"content": out.new_text} if out.new_text or not reason else {}
                        yield _event(protocol.chat_chunk(rid, self.model_name, delta, reason))
                    else:
                        yield _event(protocol.completion(rid, self.model_name, out.new_text, reason, None))
            yield "data: [DONE]\n\n"
        finally:
            if not finished:
                self.engine.abort(rid)

    def _prometheus(self, m: dict[str, Any]) -> str:
        lines: list[str] = []

        def metric(name: str, kind: str, help: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP cuvil_serve_{name} {help}")
            lines.append(f"# TYPE cuvil_serve_{name} {kind}")
            lines.extend(f"cuvil_serve_{name}{labels} {value}" for labels, value in samples)

        finished = m["finished"]
        metric(
            "requests_finished_total",
            "counter",
            "requests finished, by reason (stop, length, abort, error)",
            [(f'{{reason="{r}"}}', finished.get(r, 0)) for r in ("stop", "length", "abort", "error")],
        )
        with self._lock:
            http = sorted(self.http.items())
        metric(
            "http_requests_total",
            "counter",
            "HTTP requests by route and status",
            [(f'{{route="{r}",status="{s}"}}', n) for (r, s), n in http],
        )
        metric("prompt_tokens_total", "counter", "prompt tokens accepted", [("", m["prompt_tokens"])])
        metric("generation_tokens_total", "counter", "tokens generated", [("", m["generation_tokens"])])
        metric("steps_total", "counter", "model steps run", [("", m["steps"])])
        metric("step_seconds_total", "counter", "seconds spent in model steps", [("", m["step_seconds"])])
        metric("preemptions_total", "counter", "sequences preempted (recomputed)", [("", m["preemptions"])])
        metric(
            "prefix_shared_blocks_total",
            "counter",
            "blocks shared by prefix",
            [("", m["prefix_shared_blocks"])],
        )
        metric("running", "gauge", "sequences running", [("", m["running"])])
        metric("waiting", "gauge", "sequences waiting (the queue)", [("", m["waiting"])])
        metric("free_blocks", "gauge", "free KV cache blocks", [("", m["free_blocks"])])
        metric("total_blocks", "gauge", "KV cache blocks", [("", m["total_blocks"])])
        metric("compiles", "gauge", "compiles of the model step", [("", m["compiles"])])
        metric("threads", "gauge", "torch threads of the model step", [("", m["threads"])])
        return "\n".join(lines) + "\n"


def _event(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def build_app(engine: AsyncEngine, model_name: str) -> Starlette:
    """The API over ``engine``; the engine loop starts and stops with the app (lifespan)."""
    api = _Api(engine, model_name)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    routes = [
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/health", api.health, methods=["GET"]),
        Route("/metrics", api.metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.api = api
    return app


class BackgroundServer:
    """uvicorn serving ``app`` on ``host:port`` in a thread (tests, the benchmark);
    ``port=0`` picks a free port (``.url`` says which)."""

    def __init__(self, app: Starlette, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self.config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(self.config)
        self._thread = threading.Thread(target=self.server.run, name="cuvil-serve-http", daemon=True)
        self.url = ""

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the HTTP server did not start")
            time.sleep(0.02)
        sock = self.server.servers[0].sockets[0]
        host, port = sock.getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(30)


__all__ = ["BackgroundServer", "build_app"]
