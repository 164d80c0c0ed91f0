"""One command starts the server: ``python -m cuvil_serve --model tiny-llama --port N``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_python_m_cuvil_serve_serves(tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cuvil_serve",
            "--model",
            "tiny-llama",
            "--port",
            str(port),
            "--num-blocks",
            "32",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.2)
        r = httpx.post(
            url + "/v1/completions",
            json={"model": "tiny-llama", "prompt": "def", "max_tokens": 4},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1
        # --threads 0 (auto): every core but one for the step
        metrics = httpx.get(url + "/metrics", timeout=30).text
        want = max(1, len(os.sched_getaffinity(0)) - 1)
        assert f"cuvil_serve_threads {want}" in metrics.splitlines()
    finally:
        proc.terminate()
        proc.wait(30)


def test_engine_threads():
    from cuvil_serve.__main__ import engine_threads

    assert engine_threads(0, 1) == 1
    assert engine_threads(0, 2) == 1
    assert engine_threads(0, 16) == 15
    assert engine_threads(3, 2) == 3  # asked for: as asked
    with pytest.raises(SystemExit, match="--threads"):
        engine_threads(-1, 4)
