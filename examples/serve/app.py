"""The Ray Serve deployment: replicas load the Cuvil artifact and serve batches.

Each replica calls ``cu.load`` once (no model source, no C compiler, no capture);
``@serve.batch`` gathers concurrent requests into one batch, which the artifact runs
at whatever batch size arrived (one symbolic artifact serves them all).
"""

from __future__ import annotations

from typing import Any

import torch
from ray import serve
from starlette.requests import Request


@serve.deployment(ray_actor_options={"num_cpus": 1})
class CuvilClassifier:
    def __init__(self, artifact: str) -> None:
        import cuvil as cu

        torch.set_num_threads(1)  # one core per replica
        self.model = cu.load(artifact)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def predict(self, items: list[list[list[float]]]) -> list[dict[str, Any]]:
        x = torch.tensor(items, dtype=torch.float32)
        with torch.no_grad():
            probs = self.model(x)
        return [{"probs": p.tolist(), "batch": len(items)} for p in probs]

    async def __call__(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        return await self.predict(body["x"])  # type: ignore[no-any-return]


def app(artifact: str, replicas: int = 2) -> Any:
    return CuvilClassifier.options(num_replicas=replicas).bind(artifact)
