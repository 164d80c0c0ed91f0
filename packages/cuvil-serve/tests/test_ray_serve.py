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
        serve.run(llm_app(MODEL, replicas=2, num_cpus=0.5, engine={"num_blocks": 64, "block_size": 8}), route_prefix="/", name="cuvil-llm")
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


@pytest.mark.slow
def test_a_killed_replica_loses_no_retried_request(ray_url, tiny, reference):
    import ray

    prompts = [f"class C{i}:\n    pass" for i in range(16)]
    results: dict[int, str] = {}
    errors: list[str] = []

    def one(i: int) -> None:
        try:
            results[i] = complete(ray_url, prompts[i], 24, retries=20)
        except AssertionError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    time.sleep(1.0)
    replicas = [a for a in ray.util.list_named_actors(all_namespaces=True) if "SERVE_REPLICA" in a["name"]]
    assert len(replicas) == 2, replicas
    ray.kill(ray.get_actor(replicas[0]["name"], namespace=replicas[0]["namespace"]), no_restart=True)
    for t in threads:
        t.join()
    assert not errors, errors
    for i, p in enumerate(prompts):
        assert results[i] == tiny.tokenizer.decode(reference(tiny.tokenizer.encode(p), 24)), i
