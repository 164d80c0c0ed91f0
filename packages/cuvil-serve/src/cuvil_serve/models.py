"""The models the server knows by name: transformers Llama configs with random weights
from a seed (nothing is downloaded), the vocabulary the shipped tokenizer's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cuvil_serve.tokenizer import Tokenizer

#: name -> LlamaConfig fields besides the vocabulary; ``tiny-llama`` is what the tests use,
#: ``small-llama`` what the benchmark serves
CONFIGS: dict[str, dict[str, Any]] = {
    "tiny-llama": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    ),
    "small-llama": dict(
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    ),
}


class UnknownModel(KeyError):
    """A model name the server does not know."""


@dataclass
class LoadedModel:
    name: str
    model: Any  # transformers' LlamaForCausalLM, eval, float32
    tokenizer: Tokenizer
    max_model_len: int


def build_model(
    name: str = "tiny-llama", *, seed: int = 0, tokenizer: Tokenizer | None = None
) -> LoadedModel:
    """``name``'s model with random weights drawn from ``seed`` (the same weights every time)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if name not in CONFIGS:
        raise UnknownModel(f"unknown model {name!r}; known: {', '.join(sorted(CONFIGS))}")
    tokenizer = tokenizer or Tokenizer()
    fields: dict[str, Any] = dict(
        CONFIGS[name],
        vocab_size=tokenizer.vocab_size,
        bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id,
        pad_token_id=tokenizer.unk_id,
        attn_implementation="sdpa",
    )
    config = LlamaConfig(**fields)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    model.requires_grad_(False)
    return LoadedModel(name, model, tokenizer, config.max_position_embeddings)


__all__ = ["CONFIGS", "LoadedModel", "UnknownModel", "build_model"]
