"""OpenAI's request bodies, checked, into the engine's terms; the chat template; OpenAI's
response and chunk objects (docs/serving.md, "The HTTP API")."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from cuvil_serve.sampling import BadParameter, SamplingParams
from cuvil_serve.tokenizer import Tokenizer


class ApiError(Exception):
    """An HTTP error in OpenAI's error format."""

    def __init__(
        self, status: int, message: str, *, type: str, param: str | None = None, code: str | None = None
    ):
        super().__init__(message)
        self.status = status
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}


def bad(param: str, message: str) -> ApiError:
    return ApiError(400, message, type="invalid_request_error", param=param)


#: [Note: the chat template] -- deliberately simple and documented (docs/serving.md): the
#: shipped tokenizer has no chat tokens, so roles are written as text
ROLES = ("system", "user", "assistant")


def chat_prompt(messages: list[dict[str, str]]) -> str:
    """``<|role|>\\n{content}\\n`` per message, then ``<|assistant|>\\n`` (the tokenizer adds ``<s>``)."""
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"


@dataclass
class Parsed:
    model: str
    prompt_ids: list[int]
    params: SamplingParams
    stream: bool


def _get(body: dict[str, Any], name: str, types: tuple[type, ...], default: Any) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        names = " or ".join(t.__name__ for t in types)
        raise bad(name, f"{name} must be {names}, got {type(value).__name__} {value!r}"[:300])
    return value


#: OpenAI fields this server does not implement: refused unless left at their default
UNSUPPORTED = {"n": 1, "best_of": 1, "echo": False, "logprobs": None, "suffix": None, "tools": None}


def parse(body: Any, tokenizer: Tokenizer, *, chat: bool, max_model_len: int) -> Parsed:
    if not isinstance(body, dict):
        raise bad("body", "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", "model is required (a string; GET /v1/models lists it)")
    for name, default in UNSUPPORTED.items():
        if body.get(name, default) not in (default, None):
            raise bad(name, f"{name}={body[name]!r} is not supported (only {default!r})")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad("messages", "messages must be a non-empty list of {role, content} objects")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise bad(
                    f"messages[{i}]",
                    f"messages[{i}] must have a role in {ROLES} and a string content, got {m!r}"[:300],
                )
        prompt_ids = tokenizer.encode(chat_prompt(messages))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_ids = tokenizer.encode(prompt)
        elif (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            prompt_ids = list(prompt)
        else:
            raise bad(
                "prompt", "prompt must be a string or a non-empty list of token ids (one prompt per request)"
            )
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 4:
        raise bad("stop", "stop must be a string or a list of at most 4 strings")
    if chat:
        max_tokens = _get(body, "max_completion_tokens", (int,), None)
        max_tokens = _get(body, "max_tokens", (int,), max_tokens)
        if max_tokens is None:  # the rest of the context
            max_tokens = max(1, max_model_len - len(prompt_ids))
    else:
        max_tokens = _get(body, "max_tokens", (int,), 16)
    try:
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=float(_get(body, "temperature", (int, float), 1.0)),
            top_p=float(_get(body, "top_p", (int, float), 1.0)),
            top_k=_get(body, "top_k", (int,), -1),
            seed=_get(body, "seed", (int,), None),
            stop=tuple(stop),
            stop_token_ids=tuple(_get(body, "stop_token_ids", (list,), [])),
            ignore_eos=_get(body, "ignore_eos", (bool,), False),
        )
    except BadParameter as e:
        raise bad(e.param, str(e)) from None
    return Parsed(model, prompt_ids, params, _get(body, "stream", (bool,), False))


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def completion(
    rid: str, model: str, text: str, reason: str | None, usage: dict[str, int] | None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}],
    }
    if usage is not None:
        out["usage"] = usage
    return out


def chat_completion(
    rid: str, model: str, text: str, reason: str | None, usage: dict[str, int]
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}],
        "usage": usage,
    }


def chat_chunk(rid: str, model: str, delta: dict[str, str], reason: str | None) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": reason}],
    }


__all__ = ["ApiError", "Parsed", "chat_prompt", "parse"]
