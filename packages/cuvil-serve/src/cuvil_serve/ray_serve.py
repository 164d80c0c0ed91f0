"""The OpenAI-compatible server as a Ray Serve deployment with replicas, for users who
outgrow one machine (``pip install 'cuvil-serve[ray]'``; docs/serving.md, "Ray Serve").

    from ray import serve
    from cuvil_serve.ray_serve import llm_app
    serve.run(llm_app("tiny-llama", replicas=2), route_prefix="/")

Each replica builds the model (the same seed: the same weights in every replica), its own
engine and cache, and serves the same starlette app as ``python -m cuvil_serve``
(``serve.ingress`` with a builder evaluated on the replica). Ray Serve's proxy spreads
requests over the replicas; a replica that dies is replaced by the controller, and a
client that retries a failed request is served by another (``test_ray_serve.py``).
"""

from __future__ import annotations

from typing import Any


def llm_app(
    model: str = "tiny-llama",
    *,
    seed: int = 0,
    replicas: int = 2,
    num_cpus: float = 1,
    threads: int = 1,
    engine: dict[str, Any] | None = None,
) -> Any:
    """A bound Ray Serve application: ``replicas`` replicas of ``model``'s server.
    ``engine`` holds :class:`EngineConfig` fields; ``threads`` is torch's per replica."""
    from ray import serve

    engine_fields = dict(engine or {})

    def build() -> Any:
        import torch

        from cuvil_serve.api import build_app
        from cuvil_serve.engine import AsyncEngine, Engine, EngineConfig
        from cuvil_serve.models import build_model

        torch.set_num_threads(threads)
        loop_engine = AsyncEngine(Engine(build_model(model, seed=seed), EngineConfig(**engine_fields)))
        loop_engine.start()  # the app's lifespan starts it too; starting twice is a no-op
        return build_app(loop_engine, model)

    deployment: Any = serve.deployment(
        serve.ingress(build)(),
        name="cuvil-llm",
        num_replicas=replicas,
        ray_actor_options={"num_cpus": num_cpus},
    )
    return deployment.bind()


__all__ = ["llm_app"]
