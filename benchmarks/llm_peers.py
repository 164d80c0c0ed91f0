"""The peers of ``benchmarks.llm``: onnxruntime-genai and llama.cpp, and what every child shares.

    python -m benchmarks.llm_peers PEER PRECISION ARTIFACT ARGS_JSON   # one child (benchmarks.llm starts it)

Both peers are optional: ``benchmarks.llm`` exports the same random-weight model to each
where its package imports, and a peer that is missing, fails to export or fails to run
gets a row saying why. Neither is installed by ``nox -s bench``; benchmarks/README.md
lists the steps.

* **onnxruntime-genai** (``pip install --no-deps onnxruntime-genai onnx-ir``): its model
  builder (``python -m onnxruntime_genai.models.builder -p fp32|int8|int4 -e cpu``) turns
  the saved Hugging Face folder into its ONNX decoder (GroupQueryAttention, a KV cache
  shared between past and present, ``MatMulNBits`` for int8/int4 with the builder's CPU
  defaults: block 32, ``accuracy_level`` 4, i.e. activations quantized to int8 inside the
  product). Decoding is its ``Generator`` (greedy, ``min_length`` = ``max_length`` so
  every sequence runs the same steps), ``intra_op_num_threads`` = the run's threads in
  ``genai_config.json``. No bf16 on its CPU provider (the builder's list of precision and
  provider pairs has BF16 only for CUDA and TRT-RTX).
* **llama.cpp** (``llama-cpp-python``, which builds llama.cpp from source with
  ``-march=native``): ``convert_hf_to_gguf.py`` from the llama.cpp source (``--llama-cpp-src``:
  the sdist's ``vendor/llama.cpp``) writes an f32 or bf16 GGUF; ``llama_model_quantize``
  (as ``llama-quantize`` does, its default mixture: Q4_0 keeps ``output.weight`` in Q6_K)
  makes Q8_0 and Q4_0 from the f32 one. Decoding goes through llama.cpp's C API
  (``llama_batch`` with one sequence id per row, so batch 4 and 16 decode as one batch
  of sequences, as its ``batched`` example does), ``n_threads`` = ``n_threads_batch`` =
  the run's threads, the other context parameters at their defaults, greedy argmax over
  the logits in numpy.

Everything here imports numpy only at module level, so a peer's child process does not
carry torch's ~220 MB in its peak RSS.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

PEERS = ("onnxruntime-genai", "llama.cpp")
# what each peer runs for each precision, or why it cannot
ORT_PRECISIONS = {"fp32": "fp32", "int8": "int8", "int4": "int4", "int4-a8": "int4"}
#: (int4-a8, int4 weights times activations rounded to int8 per block of 32, is what both peers'
#: int4 already is: Q4_0 x Q8_0, MatMulNBits at accuracy_level 4)
GGUF_PRECISIONS = {"fp32": "F32", "bf16": "BF16", "int8": "Q8_0", "int4": "Q4_0", "int4-a8": "Q4_0"}
NO_BF16_ORT = "no bf16 on onnxruntime-genai's CPU provider (its builder: BF16 for CUDA / TRT-RTX only)"

Runner = Callable[[np.ndarray, int], np.ndarray]


class PeerUnavailable(Exception):
    """A peer that cannot run here; the message is the row's text."""


# -- shared by every child -------------------------------------------------------------------


def prompt(vocab: int, batch: int, length: int, seed: int) -> np.ndarray:
    """Token ids ``[batch, length]`` (int64), the same in every child for the same seed."""
    return np.random.default_rng(seed).integers(3, vocab, (batch, length), dtype=np.int64)


def peak_rss_mb() -> float:
    """This process's high-water mark of resident memory (``VmHWM``), MB. Each child is a
    fresh ``execve``, whose ``VmHWM`` starts from nothing; ``getrusage``'s ``ru_maxrss``
    would instead keep the parent's (the benchmark's) peak across ``execve``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(run: Runner, args: Any, vocab: int, start: float) -> dict[str, Any]:
    """Times ``run(ids, n)`` (greedy, exactly ``n`` new tokens, returns them ``[batch, n]``):
    decode tokens/s per batch as ``batch * (n - 1) / (t_n - t_1)`` (medians of ``repeats``:
    the prefill and the first token cancel), time to first token per prompt length at batch 1,
    the first call (from ``start``: model load / compile included), the batch-1 tokens."""
    n = args.new_tokens
    out: dict[str, Any] = {}
    tokens = run(prompt(vocab, 1, args.prompt, 1), n)
    out["first_generate_s"] = time.perf_counter() - start
    out["tokens"] = [int(t) for t in tokens[0]]
    decode: dict[str, float] = {}
    for batch in args.batches:
        ids = prompt(vocab, batch, args.prompt, batch)
        run(ids, n)  # this batch's first call (variants, buffers)
        longs, shorts = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            run(ids, n)
            longs.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            run(ids, 1)
            shorts.append(time.perf_counter() - t0)
        step = (statistics.median(longs) - statistics.median(shorts)) / (n - 1)
        decode[str(batch)] = batch / step
    out["decode_tokens_per_s"] = decode
    ttft: dict[str, float] = {}
    for length in args.ttft_prompts:
        ids = prompt(vocab, 1, length, length)
        run(ids, 1)
        ts = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            run(ids, 1)
            ts.append(time.perf_counter() - t0)
        ttft[str(length)] = statistics.median(ts)
    out["ttft_s"] = ttft
    out["peak_rss_mb"] = peak_rss_mb()
    return out


# -- exporting (in the parent, each tool in its own process) ---------------------------------


def save_hf(model: Any, folder: Path, vocab: int) -> Path:
    """The random-weight model and a tokenizer made here (``benchmarks.llm_tokenizer``) as a
    Hugging Face folder, the input of both peers' converters."""
    from benchmarks.llm_tokenizer import make_tokenizer

    model.save_pretrained(folder)
    make_tokenizer(folder, vocab)
    return folder


def _run_tool(cmd: list[str], timeout: int) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise PeerUnavailable(f"{Path(cmd[1]).name if len(cmd) > 1 else cmd[0]} timed out") from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
        raise PeerUnavailable(f"export failed: {lines[-1][:200] if lines else proc.returncode}")


def _streamed(name: str) -> bool:
    """Whether a decode step reads the whole tensor: not the token embedding (a gather of one
    row per token) nor the rotary tables."""
    return not any(s in name for s in ("embed_tokens", "token_embd", "cos_cache", "sin_cache", "rope_freqs"))


def prepare_ort(hf: Path, precision: str, out: Path, threads: int, timeout: int) -> tuple[Path, int]:
    """onnxruntime-genai's builder output for ``precision``, and the bytes a decode step
    streams (its initializers but the embedding and rotary tables)."""
    if precision not in ORT_PRECISIONS:
        raise PeerUnavailable(NO_BF16_ORT if precision == "bf16" else f"no {precision} in its builder")
    try:
        import onnx
        import onnxruntime_genai  # noqa: F401
    except ImportError as e:
        raise PeerUnavailable(f"not installed ({e}); see benchmarks/README.md") from None
    b = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out)]
    _run_tool([*b, "-p", ORT_PRECISIONS[precision], "-e", "cpu"], timeout)
    cfg_path = out / "genai_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["model"]["decoder"]["session_options"]["intra_op_num_threads"] = threads
    cfg_path.write_text(json.dumps(cfg, indent=1))
    graph = onnx.load(str(out / cfg["model"]["decoder"]["filename"]), load_external_data=False).graph
    total = 0
    for init in graph.initializer:
        if not _streamed(init.name):
            continue
        ext = {e.key: e.value for e in init.external_data}
        total += int(ext["length"]) if "length" in ext else len(init.raw_data)
    return out, total


def prepare_gguf(
    hf: Path, precision: str, work: Path, src: str | None, threads: int, timeout: int
) -> tuple[Path, int]:
    """A GGUF file of ``precision`` (converted once in f32, then quantized) and the bytes a
    decode step streams (every tensor but the token embedding)."""
    try:
        import llama_cpp
    except ImportError as e:
        raise PeerUnavailable(f"llama-cpp-python not installed ({e}); see benchmarks/README.md") from None
    if not src or not (Path(src) / "convert_hf_to_gguf.py").is_file():
        raise PeerUnavailable("needs --llama-cpp-src (llama.cpp's source, for convert_hf_to_gguf.py)")
    kind = GGUF_PRECISIONS[precision]
    convert = [sys.executable, str(Path(src) / "convert_hf_to_gguf.py"), str(hf)]
    outtype = {"F32": "f32", "BF16": "bf16"}.get(kind, "f32")
    base = work / f"model-{outtype}.gguf"
    if not base.exists():
        _run_tool([*convert, "--outtype", outtype, "--outfile", str(base)], timeout)
    path = base
    if kind in ("Q8_0", "Q4_0"):
        path = work / f"model-{kind}.gguf"
        _quiet_llama_cpp(llama_cpp)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind}")
        params.nthread = threads
        import ctypes

        rc = llama_cpp.llama_model_quantize(str(base).encode(), str(path).encode(), ctypes.byref(params))
        if rc != 0:
            raise PeerUnavailable(f"llama_model_quantize to {kind} failed ({rc})")
    sys.path.insert(0, str(Path(src) / "gguf-py"))
    try:
        from gguf import GGUFReader
    finally:
        sys.path.pop(0)
    total = sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors if _streamed(t.name))
    return path, total


_LOG_SINK: list[Any] = []  # the callback must outlive the call that installs it


def _quiet_llama_cpp(L: Any) -> None:
    """llama.cpp's log (every tensor it loads or quantizes) to nowhere."""
    import ctypes

    if not _LOG_SINK:
        _LOG_SINK.append(L.llama_log_callback(lambda level, text, data: None))
        L.llama_log_set(_LOG_SINK[0], ctypes.c_void_p())


# -- the children -------------------------------------------------------------------------------


def ort_child(path: str, args: Any) -> dict[str, Any]:
    import onnxruntime_genai as og

    start = time.perf_counter()
    model = og.Model(path)
    vocab = json.loads((Path(path) / "genai_config.json").read_text())["model"]["vocab_size"]

    def run(ids: np.ndarray, n: int) -> np.ndarray:
        batch, length = ids.shape
        params = og.GeneratorParams(model)
        params.set_search_options(
            batch_size=batch, max_length=length + n, min_length=length + n, do_sample=False
        )
        gen = og.Generator(model, params)
        gen.append_tokens(ids.astype(np.int32))
        for _ in range(n):
            gen.generate_next_token()
        return np.stack([np.asarray(gen.get_sequence(i))[length : length + n] for i in range(batch)])

    out = measure(run, args, vocab, start)
    out["version"] = og.__version__
    return out


def llama_cpp_child(path: str, args: Any) -> dict[str, Any]:

    import llama_cpp as L

    _quiet_llama_cpp(L)
    L.llama_backend_init()
    start = time.perf_counter()
    model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    longest = max([args.prompt + args.new_tokens, *(p + 1 for p in args.ttft_prompts)])
    state: dict[str, Any] = {}

    def context(batch: int, cells: int) -> Any:
        """A context for ``batch`` sequences of ``cells`` positions each (kept while it fits)."""
        if state.get("batch") == batch and state["cells"] >= cells:
            return state["ctx"]
        if "ctx" in state:
            L.llama_batch_free(state["tokens"])
            L.llama_free(state["ctx"])
        cells = -(-max(cells, longest if batch == 1 else 0) // 256) * 256
        cp = L.llama_context_default_params()
        cp.n_ctx = batch * cells
        cp.n_seq_max = batch
        cp.n_threads = cp.n_threads_batch = args.threads
        ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not make a context of {batch} x {cells}")
        state.update(batch=batch, cells=cells, ctx=ctx, tokens=L.llama_batch_init(batch * cells, 0, 1))
        return ctx

    def run(ids: np.ndarray, n: int) -> np.ndarray:
        batch, length = ids.shape
        ctx = context(batch, length + n)
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        b, cap = state["tokens"], state["batch"] * state["cells"]
        token, pos, n_seq, logit = (
            np.ctypeslib.as_array(f, shape=(cap,)) for f in (b.token, b.pos, b.n_seq_id, b.logits)
        )
        # the prompt of every sequence in one batch, logits only at each one's last position
        b.n_tokens = batch * length
        token[: batch * length] = ids.reshape(-1)
        pos[: batch * length] = np.tile(np.arange(length), batch)
        n_seq[: batch * length] = 1
        logit[: batch * length] = 0
        logit[length - 1 : batch * length : length] = 1
        for i in range(batch * length):
            b.seq_id[i][0] = i // length
        got = np.empty((batch, n), dtype=np.int64)
        for step in range(n):
            if L.llama_decode(ctx, b) != 0:
                raise RuntimeError("llama_decode failed")
            logits = np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(batch, vocab))
            got[:, step] = logits.argmax(axis=1)
            if step == n - 1:
                break
            # one new token per sequence
            b.n_tokens = batch
            token[:batch] = got[:, step]
            pos[:batch] = length + step
            logit[:batch] = 1
            for s in range(batch):
                b.seq_id[s][0] = s
        return got

    out = measure(run, args, vocab, start)
    out["version"] = L.__version__
    return out


def main(argv: list[str] | None = None) -> None:
    import argparse

    peer, _precision, artifact, args_json = argv if argv is not None else sys.argv[1:]
    args = argparse.Namespace(**json.loads(args_json))
    child = ort_child if peer == "onnxruntime-genai" else llama_cpp_child
    print(json.dumps(child(artifact, args)))


if __name__ == "__main__":
    main()
