"""The server as a Ray Serve deployment with two replicas, on loopback (slow: starts Ray).
Every answer equals generate()'s for its prompt alone, whichever replica served it; a
replica killed under load loses no request the client retries."""

from __future__ import annotations

import os
import socket
import threading
import time

import httpx
import pytest

pytest.importorskip("ray.serve")

MODEL = "tiny-llama"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_url():
    import ray
    from ray import serve

    from cuvil_serve.ray_serve import llm_app

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(
            llm_app(MODEL, replicas=2, num_cpus=0.5, engine={"num_blocks": 64, "block_size": 8}),
            route_prefix="/",
            name="cuvil-llm",
        )
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def complete(url: str, prompt: str, n: int, retries: int = 0) -> str:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": n, "temperature": 0}
    for attempt in range(retries + 1):
        try:
            r = httpx.post(url + "/v1/completions", json=body, timeout=120)
            if r.status_code == 200:
                return r.json()["choices"][0]["text"]
            err = f"HTTP {r.status_code}: {r.text[:300]}"
        except httpx.TransportError as e:
            err = f"{type(e).__name__}: {e}"
        if attempt < retries:
            time.sleep(0.5)
    raise AssertionError(f"{prompt!r}: {err}")


@pytest.mark.slow
def test_replicas_serve_generate_s_tokens(ray_url, tiny, reference):
    assert httpx.get(ray_url + "/health", timeout=30).json() == {"status": "ok"}
    prompts = [f"def g{i}(x):\n    return x * {i}" for i in range(12)]
    results: dict[int, str] = {}

    def one(i: int) -> None:
        results[i] = complete(ray_url, prompts[i], 8)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, p in enumerate(prompts):
        assert results[i] == tiny.tokenizer.decode(reference(tiny.tokenizer.encode(p), 8)), i


def stream_once(url: str, prompt: str, n: int, started: threading.Event) -> str:
    """One streamed completion's text; raises if the stream breaks or ends without [DONE]."""
    import json

    body = {"model": MODEL, "prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True}
    text = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}")
        for line in r.iter_lines():
            if line == "data: [DONE]":
                return "".join(text)
            if line.startswith("data: "):
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(chunk["error"]["message"])
                text.append(chunk["choices"][0]["text"])
                started.set()
    raise RuntimeError("the stream ended without [DONE]")


@pytest.mark.slow
def test_a_killed_replica_loses_no_retried_request(ray_url, tiny, reference):
    """16 streaming clients; once tokens flow, one replica is killed. Streams it was serving
    break; each client retries until it has a whole answer, which must be generate()'s."""
    import ray

    prompts = [f"class C{i}:\n    pass" for i in range(16)]
    results: dict[int, str] = {}
    broken: list[str] = []
    started = threading.Event()

    def one(i: int) -> None:
        for _ in range(20):
            try:
                results[i] = stream_once(ray_url, prompts[i], 64, started)
                return
            except (httpx.HTTPError, RuntimeError) as e:
                broken.append(f"{i}: {type(e).__name__}: {e}")
                time.sleep(0.5)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    assert started.wait(120), "no tokens streamed"
    replicas = [a for a in ray.util.list_named_actors(all_namespaces=True) if "SERVE_REPLICA" in a["name"]]
    assert len(replicas) == 2, replicas
    ray.kill(ray.get_actor(replicas[0]["name"], namespace=replicas[0]["namespace"]), no_restart=True)
    for t in threads:
        t.join()
    assert broken, "no stream was in flight on the killed replica: the test proved nothing"
    assert sorted(results) == list(range(16)), broken
    for i, p in enumerate(prompts):
        assert results[i] == tiny.tokenizer.decode(reference(tiny.tokenizer.encode(p), 64)), i
