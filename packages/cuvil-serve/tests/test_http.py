"""The OpenAI-compatible API over real HTTP on loopback (uvicorn on a free port, httpx):
every route, streaming in OpenAI's chunk format, the error codes, a client that leaves
mid-stream freeing its blocks; the free-block count back at its start after every test."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from cuvil_serve.api import BackgroundServer, build_app
from cuvil_serve.engine import AsyncEngine, Engine, EngineConfig
from cuvil_serve.protocol import chat_prompt

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def server(tiny):
    engine = AsyncEngine(Engine(tiny, EngineConfig(num_blocks=64, block_size=8, max_seqs=4, max_waiting=4)))
    with BackgroundServer(build_app(engine, MODEL)) as srv:
        srv.engine = engine
        yield srv


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c
    # every test leaves every block free (aborts are handled between steps)
    engine = server.engine
    for _ in range(250):
        m = engine.call(Engine.metrics)
        if m["free_blocks"] == m["total_blocks"] and m["running"] == m["waiting"] == 0:
            break
        time.sleep(0.02)
    assert m["free_blocks"] == m["total_blocks"], m


def events(response: httpx.Response) -> list:
    out = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_health_and_models(client):
    assert client.get("/health").json() == {"status": "ok"}
    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]


def test_completion_equals_generate(client, tiny, reference):
    prompt = "def f(x):"
    ids = tiny.tokenizer.encode(prompt)
    r = client.post(
        "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    ref = reference(ids, 12)
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == tiny.tokenizer.decode(ref)
    assert body["choices"][0]["finish_reason"] == ("stop" if len(ref) < 12 else "length")
    assert body["usage"] == {
        "prompt_tokens": len(ids),
        "completion_tokens": len(ref),
        "total_tokens": len(ids) + len(ref),
    }
    # token ids as the prompt: the same answer
    r2 = client.post(
        "/v1/completions", json={"model": MODEL, "prompt": ids, "max_tokens": 12, "temperature": 0}
    )
    assert r2.json()["choices"][0]["text"] == body["choices"][0]["text"]


def test_completion_stream(client, tiny, reference):
    prompt = "import os\nimport sys\n"
    ids = tiny.tokenizer.encode(prompt)
    req = {"model": MODEL, "prompt": prompt, "max_tokens": 10, "temperature": 0, "stream": True}
    with client.stream("POST", "/v1/completions", json=req) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        evs = events(r)
    assert evs[-1] == "[DONE]"
    chunks = evs[:-1]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert "".join(c["choices"][0]["text"] for c in chunks) == tiny.tokenizer.decode(reference(ids, 10))
    assert len(chunks) == len(reference(ids, 10))  # one chunk per token


def test_chat_completion_and_stream(client, tiny, reference):
    messages = [
        {"role": "system", "content": "You write Python."},
        {"role": "user", "content": "A loop, please."},
    ]
    ids = tiny.tokenizer.encode(chat_prompt(messages))
    want = tiny.tokenizer.decode(reference(ids, 8))
    req = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0}
    body = client.post("/v1/chat/completions", json=req).json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": want}
    with client.stream("POST", "/v1/chat/completions", json={**req, "stream": True}) as r:
        evs = events(r)
    assert evs[-1] == "[DONE]"
    assert evs[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(e["object"] == "chat.completion.chunk" for e in evs[:-1])
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in evs[:-1]) == want
    assert evs[-2]["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"model": "gpt-4", "prompt": "x"}, 404, "model"),
        ({"prompt": "x"}, 400, "model"),
        ({"model": MODEL, "prompt": "x", "temperature": "hot"}, 400, "temperature"),
        ({"model": MODEL, "prompt": "x", "top_p": 2}, 400, "top_p"),
        ({"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": "x", "n": 2}, 400, "n"),
        ({"model": MODEL, "prompt": [1, 99999]}, 400, "prompt"),
        ({"model": MODEL, "prompt": 5}, 400, "prompt"),
        ({"model": MODEL, "prompt": "x", "stop": 3}, 400, "stop"),
        ({"model": MODEL, "prompt": "x", "stop_token_ids": ["a"]}, 400, "stop_token_ids"),
        ({"model": MODEL, "prompt": "x", "echo": True}, 400, "echo"),
    ],
)
def test_bad_requests(client, body, status, param):
    r = client.post("/v1/completions", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_bad_chat_and_bad_json(client):
    r = client.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0]"
    r = client.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"


def test_prompt_longer_than_the_context(client):
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "x = 1\n" * 400, "max_tokens": 4})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded"
    assert "do not fit the context of 512 tokens" in err["message"]


def test_full_queue_is_429(client, server):
    gate = threading.Event()
    server.engine._commands.put(("call", lambda e: gate.wait(20)))  # hold the loop between steps
    req = {"model": MODEL, "prompt": "while True:", "max_tokens": 2, "temperature": 0}
    try:
        results = []
        threads = [
            threading.Thread(
                target=lambda: results.append(
                    httpx.post(server.url + "/v1/completions", json=req, timeout=60)
                )
            )
            for _ in range(8)
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while server.engine._accepted < 8 and time.monotonic() < deadline:
            time.sleep(0.02)
        r = client.post("/v1/completions", json=req)
        assert r.status_code == 429, r.text
        assert "busy" in r.json()["error"]["message"]
    finally:
        gate.set()
    for t in threads:
        t.join()
    assert [r.status_code for r in results] == [200] * 8


def test_disconnect_mid_stream_frees_blocks(client, server):
    before = server.engine.call(lambda e: e.finished["abort"])
    req = {
        "model": MODEL,
        "prompt": "class A:\n",
        "max_tokens": 400,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with client.stream("POST", "/v1/completions", json=req) as r:
        lines = r.iter_lines()
        got = [line for line, _ in zip(lines, range(4))]
        assert any(line.startswith("data: {") for line in got)
        assert server.engine.call(lambda e: e.blocks.num_free) < 64
    # the response is closed: the server notices, aborts the request, frees its blocks
    for _ in range(250):
        if server.engine.call(lambda e: e.finished["abort"]) > before:
            break
        time.sleep(0.02)
    assert server.engine.call(lambda e: e.finished["abort"]) == before + 1


def test_concurrent_clients_get_their_own_text(client, server, tiny, reference):
    prompts = [f"def fn_{i}(a, b):\n    return a {op} b" for i, op in enumerate("+-*/%&|^")]
    results: dict[int, str] = {}

    def one(i: int) -> None:
        r = httpx.post(
            server.url + "/v1/completions",
            json={"model": MODEL, "prompt": prompts[i], "max_tokens": 8, "temperature": 0},
            timeout=60,
        )
        results[i] = r.json()["choices"][0]["text"]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, p in enumerate(prompts):
        assert results[i] == tiny.tokenizer.decode(reference(tiny.tokenizer.encode(p), 8)), i


def test_metrics(client):
    client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2})
    text = client.get("/metrics").text
    for name in (
        "cuvil_serve_requests_finished_total",
        "cuvil_serve_generation_tokens_total",
        "cuvil_serve_prompt_tokens_total",
        "cuvil_serve_waiting",
        "cuvil_serve_running",
        "cuvil_serve_free_blocks 64",
        "cuvil_serve_total_blocks 64",
        'cuvil_serve_http_requests_total{route="/v1/completions",status="200"}',
    ):
        assert name in text, name
