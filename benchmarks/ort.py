"""onnxruntime as a fourth column: the workload exported with ``torch.onnx.export``
and run by an ``InferenceSession`` through IOBinding (inputs read and outputs
written in place in torch tensors' memory, as a deployment would).

A workload that does not export (or whose session fails) gets no ort number; the
reason is kept in the results.
"""

from __future__ import annotations

import io
from typing import Any

import torch

_NP = {torch.float32: "float32", torch.float64: "float64", torch.int64: "int64", torch.bool: "bool"}


class _AsModule(torch.nn.Module):
    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def build_ort(fn: Any, args: tuple[Any, ...], threads: int = 2, profile: str | None = None) -> Any:
    """A callable running ``fn``'s ONNX export (traced at ``args``' shapes) in onnxruntime.
    ``profile``: a file prefix for onnxruntime's own profiler (its JSON trace of every node's
    time, written when the callable's ``end_profiling()`` is called)."""
    import numpy as np
    import onnxruntime as ort

    module = fn if isinstance(fn, torch.nn.Module) else _AsModule(fn)
    names = [f"in{i}" for i in range(len(args))]
    buf = io.BytesIO()
    with torch.no_grad():
        ref = module(*args)
        torch.onnx.export(module, tuple(args), buf, input_names=names, dynamo=False, opset_version=17)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    # onnxruntime's pool spins between runs by default: interleaved with the other
    # implementations in one process, its spinning threads would steal their cores
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile
    sess = ort.InferenceSession(buf.getvalue(), opts, providers=["CPUExecutionProvider"])
    single = isinstance(ref, torch.Tensor)
    refs = [ref] if single else list(ref)
    outs = [torch.empty_like(r).contiguous() for r in refs]
    out_names = [o.name for o in sess.get_outputs()]
    in_names = [i.name for i in sess.get_inputs()]

    def run(*xs: Any) -> Any:
        binding = sess.io_binding()
        for name, x in zip(in_names, xs):
            x = x.contiguous()
            binding.bind_input(name, "cpu", 0, np.dtype(_NP[x.dtype]), list(x.shape), x.data_ptr())
        for name, o in zip(out_names, outs):
            binding.bind_output(name, "cpu", 0, np.dtype(_NP[o.dtype]), list(o.shape), o.data_ptr())
        sess.run_with_iobinding(binding)
        return outs[0] if single else tuple(outs)

    run.end_profiling = sess.end_profiling  # type: ignore[attr-defined]
    return run
