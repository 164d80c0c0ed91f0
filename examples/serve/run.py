"""One command: save the artifact, serve it on Ray Serve on loopback, check it, stop.

    python examples/serve/run.py                 # 64 requests, 2 replicas
    python examples/serve/run.py --requests 200 --keep-running

Saves ``model.py``'s classifier as a Cuvil artifact, starts a local Ray instance
(no dashboard, loopback only) with the deployment of ``app.py``, sends the requests
from a thread pool over HTTP, compares every response with eager PyTorch on the
same input, prints the throughput and the batch sizes ``@serve.batch`` formed, and
shuts Ray down (unless ``--keep-running``). Exits nonzero on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import model as model_def  # noqa: E402


def _post(url: str, x: list[list[float]]) -> dict[str, object]:
    req = urllib.request.Request(url, json.dumps({"x": x}).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--keep-running", action="store_true")
    a = ap.parse_args(argv)

    import ray
    from ray import serve

    tmp = Path(tempfile.mkdtemp(prefix="cuvil-serve-"))
    artifact = model_def.save_artifact(tmp / "classifier.cuvil")
    print(f"saved {artifact} ({artifact.stat().st_size / 1e3:.0f} kB)")

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(
        num_cpus=max(a.replicas, 2), include_dashboard=False, log_to_driver=False, configure_logging=False
    )
    try:
        import app as app_def

        serve.start(http_options={"host": "127.0.0.1", "port": a.port})
        serve.run(app_def.app(str(artifact), a.replicas), route_prefix="/", name="cuvil")
        url = f"http://127.0.0.1:{a.port}/"
        gen = torch.Generator().manual_seed(1)
        inputs = [torch.randn(model_def.SEQ, model_def.D, generator=gen) for _ in range(a.requests)]
        eager = model_def.build()
        with torch.no_grad():
            want = eager(torch.stack(inputs))
        t0 = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            got = list(pool.map(lambda x: _post(url, x.tolist()), inputs))
        elapsed = time.perf_counter() - t0
        bad = 0
        for i, r in enumerate(got):
            if not torch.allclose(torch.tensor(r["probs"]), want[i], rtol=1e-4, atol=1e-5):
                bad += 1
        batches = sorted({int(r["batch"]) for r in got})  # type: ignore[call-overload]
        print(
            f"{a.requests} requests in {elapsed:.2f} s ({a.requests / elapsed:.0f} req/s) on "
            f"{a.replicas} replicas; batch sizes formed: {batches}"
        )
        if bad:
            print(f"FAILED: {bad} of {a.requests} responses differ from eager")
            return 1
        print(f"all {a.requests} responses match eager")
        if a.keep_running:
            print(f"serving on {url} (Ctrl-C stops)")
            while True:
                time.sleep(3600)
    finally:
        if not a.keep_running:
            serve.shutdown()
            ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
