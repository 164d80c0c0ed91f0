"""Serving LLMs with Cuvil: a paged-cache engine with continuous batching and an
OpenAI-compatible HTTP API (docs/serving.md)."""

from __future__ import annotations
