"""Autocast (``torch.autocast``, ``torch.amp.autocast``, ``torch.set_autocast_enabled``).

Under autocast eager PyTorch runs some ops (matmul, linear, conv, ...) in a lower dtype,
some in float32, and casts the operands of others to their widest type. Cuvil captures
CPU and CUDA autocast ([Note: autocast captured]), each with its device's rules
(:data:`CPU_POLICY`, :data:`CUDA_POLICY`); autocast for another device type on the
graph's tensors is a located :class:`CompileError` (eager under ``fallback="eager"``).
The autocast state of the call (enabled, and the dtype, for the inputs' device types)
is part of the structure key: an artifact from outside autocast never runs inside it,
nor the other way round.

[Note: autocast captured] Autocast decides per ATen op, by the op's *cast policy*: the
op's eligible tensor operands (floating, not float64, on the autocast device) are cast
to the autocast dtype (``lower``), to float32 (``fp32``), or to the widest floating
dtype among them (``promote``); every other op runs on what it is given. torch keeps
the policies in C++ (``aten/src/ATen/autocast_mode.cpp``: the ``AutocastCPU`` and
``AutocastCUDA`` registrations); :data:`CPU_POLICY` and :data:`CUDA_POLICY` are those
lists, as data (a test checks each against the operators torch 2.13 registers for its
dispatch key, and each policy against eager). CUDA has one more policy, ``fp32`` unless
the call names a ``dtype`` (``sum``, ``softmax``, ``cumsum`` ...: torch passes
``dtype=torch.float32``, which computes what the operand cast to float32 computes). While a capture runs under autocast
(entered in the function, or on at the call), each torch call the tracer records is
looked up by its name (:func:`policy`) and its operands are cast first, as recorded
``cast`` nodes, so the graph says where every cast goes and computes exactly what eager
computes; it needs no autocast when it runs (the artifact runs with autocast off). A
torch call that stays an ``extern`` (a composite such as ``einsum``, whose inner
``bmm`` autocast casts in C++) carries the autocast state and runs under it, types and
values alike (``Extern``'s ``autocast`` attribute in :mod:`cuvil_ir.graph_ir.ops.core`);
such calls are never expanded through ``torch._refs`` under autocast, where the casts
inside them would be guessed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from cuvil.errors import CompileError, SourceLoc

HINT = (
    "only CPU and CUDA autocast regions are captured: cast explicitly instead (x.to(torch.float16) @ "
    "w.to(torch.float16)), or compile the function with a half model and inputs, or leave "
    "fallback='eager' (the default) so such calls run eagerly"
)

LOWER, FP32, PROMOTE = "lower", "fp32", "promote"
#: CUDA's ``fp32_set_opt_dtype`` and ``fp32_append_dtype``: float32 unless the call gives a ``dtype``
FP32_UNLESS_DTYPE = "fp32_unless_dtype"

#: ATen op -> its cast policy under CPU autocast (torch 2.13's ``AutocastCPU`` kernels)
CPU_POLICY: dict[str, str] = {
    **dict.fromkeys(
        """conv1d conv2d conv3d bmm mm linalg_vecdot baddbmm addmm addbmm linear _convolution
        matmul conv_tbc mkldnn_rnn_layer conv_transpose1d conv_transpose2d conv_transpose3d prelu
        scaled_dot_product_attention _native_multi_head_attention _addmm_activation""".split(),
        LOWER,
    ),
    **dict.fromkeys(
        """avg_pool3d binary_cross_entropy grid_sampler polar prod quantile nanquantile stft cdist
        grid_sampler_2d _grid_sampler_2d_cpu_fallback grid_sampler_3d trace view_as_complex cholesky
        cholesky_inverse cholesky_solve inverse lu_solve orgqr ormqr pinverse max_pool3d max_unpool2d
        max_unpool3d adaptive_avg_pool3d reflection_pad1d reflection_pad2d replication_pad1d
        replication_pad2d replication_pad3d mse_loss cosine_embedding_loss nll_loss nll_loss2d
        hinge_embedding_loss poisson_nll_loss smooth_l1_loss cross_entropy_loss l1_loss huber_loss
        margin_ranking_loss soft_margin_loss triplet_margin_loss multi_margin_loss ctc_loss kl_div
        multilabel_margin_loss binary_cross_entropy_with_logits fft_fft fft_ifft fft_fft2 fft_ifft2
        fft_fftn fft_ifftn fft_rfft fft_irfft fft_rfft2 fft_irfft2 fft_rfftn fft_irfftn fft_hfft
        fft_ihfft linalg_cond linalg_matrix_rank linalg_solve linalg_cholesky linalg_svdvals
        linalg_eigvals linalg_eigvalsh linalg_inv linalg_householder_product linalg_tensorinv
        linalg_tensorsolve fake_quantize_per_tensor_affine geqrf _lu_with_info qr svd
        triangular_solve fractional_max_pool2d fractional_max_pool3d adaptive_max_pool3d
        multilabel_margin_loss_forward linalg_qr linalg_cholesky_ex linalg_svd linalg_eig linalg_eigh
        linalg_lstsq linalg_inv_ex""".split(),
        FP32,
    ),
    **dict.fromkeys("stack cat index_copy".split(), PROMOTE),
}

#: ATen op -> its cast policy under CUDA autocast (torch 2.13's ``AutocastCUDA`` kernels;
#: ``binary_cross_entropy`` is registered to raise, as CUDA autocast bans it: :data:`BANNED`)
CUDA_POLICY: dict[str, str] = {
    **dict.fromkeys(
        """_convolution conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d
        convolution cudnn_convolution cudnn_convolution_transpose prelu addmm addmv addr matmul einsum mm
        mv linalg_vecdot linear addbmm baddbmm bmm chain_matmul linalg_multi_dot _thnn_fused_lstm_cell
        _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell
        _scaled_dot_product_flash_attention scaled_dot_product_attention""".split(),
        LOWER,
    ),
    **dict.fromkeys(
        """acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow softplus
        layer_norm native_layer_norm group_norm rms_norm frobenius_norm nuclear_norm cosine_similarity
        poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div l1_loss
        smooth_l1_loss huber_loss mse_loss margin_ranking_loss multilabel_margin_loss soft_margin_loss
        triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm
        logsumexp upsample_nearest1d _upsample_nearest_exact1d upsample_nearest2d
        _upsample_nearest_exact2d upsample_nearest3d _upsample_nearest_exact3d upsample_linear1d
        upsample_bilinear2d _upsample_bilinear2d_aa upsample_trilinear3d upsample_bicubic2d
        _upsample_bicubic2d_aa""".split(),
        FP32,
    ),
    **dict.fromkeys(
        "prod softmax log_softmax cumprod cumsum linalg_vector_norm linalg_matrix_norm sum norm".split(),
        FP32_UNLESS_DTYPE,
    ),
    **dict.fromkeys(
        "addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put scatter_add tensordot".split(),
        PROMOTE,
    ),
}

#: ops autocast refuses on a device (torch raises when they are called under it)
BANNED: dict[str, frozenset[str]] = {"cuda": frozenset({"binary_cross_entropy"})}

#: device type -> its autocast policies: the device types whose autocast a capture reproduces
POLICIES: dict[str, dict[str, str]] = {"cpu": CPU_POLICY, "cuda": CUDA_POLICY}
CAPTURED_DEVICES = frozenset(POLICIES)

#: torch-level names that call an ATen op of another name (the Python operator, an alias,
#: the ``torch.nn.functional`` wrapper)
CALL_NAMES: dict[str, str] = {
    "__matmul__": "matmul",
    "__rmatmul__": "matmul",
    "concat": "cat",
    "concatenate": "cat",
    "cross_entropy": "cross_entropy_loss",
    "grid_sample": "grid_sampler",
    "__pow__": "pow",
    "__rpow__": "pow",
    "__ipow__": "pow",
}


def _pad_op(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The ATen op ``F.pad`` runs: reflection and replication padding have fp32 kernels."""
    mode = kwargs.get("mode", args[2] if len(args) > 2 else "constant")
    x = args[0] if args else kwargs.get("input")
    if mode not in ("reflect", "replicate") or not isinstance(x, torch.Tensor):
        return None
    pads = kwargs.get("pad", args[1] if len(args) > 1 else ())
    dims = len(pads) // 2
    return f"{'reflection' if mode == 'reflect' else 'replication'}_pad{dims}d"


#: torch-level calls whose ATen op depends on their arguments
_BY_ARGUMENTS: dict[str, Callable[[tuple[Any, ...], dict[str, Any]], str | None]] = {"pad": _pad_op}


def policy(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], device: str = "cpu") -> str | None:
    """The autocast policy of the torch call ``func(*args, **kwargs)`` on ``device``
    (``"cpu"`` or ``"cuda"``), or ``None``."""
    table = POLICIES[device]
    name = aten_name(func, args, kwargs)
    return table.get(name) if name else None


def aten_name(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The ATen op a torch call runs, as autocast's registrations name it."""
    name = getattr(func, "__name__", "")
    module = getattr(func, "__module__", "") or ""
    if name in _BY_ARGUMENTS:
        return _BY_ARGUMENTS[name](args, kwargs)
    if module.startswith("torch.linalg") or module == "torch._C._linalg":
        name = name if name.startswith("linalg_") else f"linalg_{name}"
    elif module.startswith("torch.fft") or module == "torch._C._fft":
        name = name if name.startswith("fft_") else f"fft_{name}"
    return CALL_NAMES.get(name, name)


# -- the state of a call and of a capture --------------------------------------------

_is_any_enabled = torch._C._is_any_autocast_enabled


def state(leaves: list[Any]) -> tuple[tuple[str, torch.dtype], ...]:
    """The autocast state of a call: ``(device type, dtype)`` for each device type of the
    tensor leaves (cpu when there are none) where autocast is enabled.

    Called on every call: one C call when autocast is off everywhere.
    """
    if not _is_any_enabled():
        return ()
    devices = {x.device.type for x in leaves if isinstance(x, torch.Tensor)} or {"cpu"}
    return tuple((d, torch.get_autocast_dtype(d)) for d in sorted(devices) if _enabled(d))


def _enabled(device: str) -> bool:
    try:
        return torch.is_autocast_enabled(device)
    except RuntimeError:  # a device type autocast does not know (meta): it never casts there
        return False


@contextlib.contextmanager
def entered_again(amp: tuple[tuple[str, torch.dtype], ...]) -> Iterator[None]:
    """Autocast as it was at the call (``state``), on this thread: an eager fallback of a
    call made under autocast that runs on another thread (``submit``) casts like eager."""
    with contextlib.ExitStack() as stack:
        for device, dtype in amp:
            stack.enter_context(torch.autocast(device, dtype=dtype))
        yield


@contextlib.contextmanager
def switched_off(amp: tuple[tuple[str, torch.dtype], ...]) -> Iterator[None]:
    """Autocast off for the devices of ``amp`` while a compiled program runs: its graph
    has every cast autocast made in it, and extern calls that need autocast enter it."""
    with contextlib.ExitStack() as stack:
        for device, _ in amp:
            stack.enter_context(torch.autocast(device, enabled=False))
        yield


@contextlib.contextmanager
def kept() -> Iterator[None]:
    """The thread's autocast state (per device: enabled, dtype) as it was, after a
    capture: code that entered autocast and failed midway leaves nothing on."""
    devices = ("cpu", "cuda")
    saved = [(d, _enabled(d), torch.get_autocast_dtype(d)) for d in devices]
    try:
        yield
    finally:
        for device, on, dtype in saved:
            if _enabled(device) != on:
                torch.set_autocast_enabled(device, on)
            if torch.get_autocast_dtype(device) != dtype:
                torch.set_autocast_dtype(device, dtype)


def describe(amp: tuple[tuple[str, torch.dtype], ...]) -> str:
    return ", ".join(f"{d} {str(t).removeprefix('torch.')}" for d, t in amp) if amp else "off"


def uncaptured(amp: tuple[tuple[str, torch.dtype], ...]) -> tuple[tuple[str, torch.dtype], ...]:
    """The part of an autocast state a capture cannot reproduce (devices outside
    :data:`CAPTURED_DEVICES`)."""
    return tuple((d, t) for d, t in amp if d not in CAPTURED_DEVICES)


def at_call(amp: tuple[tuple[str, torch.dtype], ...]) -> CompileError:
    """The error for a call made with uncaptured autocast on (the function is not at fault)."""
    return CompileError(f"called under autocast ({describe(amp)}), which Cuvil does not capture", None, HINT)


def active(tracer: Any) -> tuple[tuple[str, torch.dtype], ...]:
    """The autocast state for the graph's devices while a call is captured; a located
    :class:`CompileError` where it is on for a device a capture cannot reproduce."""
    if not _is_any_enabled():
        return ()
    on = tuple((d, torch.get_autocast_dtype(d)) for d in _graph_devices(tracer) if _enabled(d))
    bad = uncaptured(on)
    if bad:
        raise CompileError(f"op captured under autocast ({describe(bad)})", tracer.source_loc(), HINT)
    return on


def check_entered(tracer: Any, fn: Any, args: tuple[Any, ...], result: Any, loc: SourceLoc | None) -> None:
    """Raise when a call in compiled code made an enabled autocast context manager
    (``torch.autocast``, ``torch.amp.autocast`` or a subclass) or enabled autocast
    (``torch.set_autocast_enabled``) for a device of the graph that a capture cannot
    reproduce (CPU autocast is captured). ``autocast(enabled=False)`` (as models use
    around rotary embeddings) is fine: nothing is cast inside it."""
    if isinstance(result, torch.amp.autocast):
        device, on = result.device, bool(result._enabled)
    elif fn is torch.set_autocast_enabled and len(args) == 2:
        device, on = str(args[0]), bool(args[1])
    else:
        return
    if on and device in _graph_devices(tracer) and device not in CAPTURED_DEVICES:
        if fn is torch.set_autocast_enabled:
            # undo it: the error leaves the function before its own reset. It was off
            # before (on at the call, or on at an earlier op, is an error already).
            torch.set_autocast_enabled(device, False)
        raise CompileError(f"autocast entered for {device} in compiled code", loc, HINT)


def _graph_devices(tracer: Any) -> list[str]:
    """The device types of the graph's inputs and lifted tensors (cpu when none)."""
    values = [*tracer.inputs, *(x.value for x in tracer.lifted)]
    devices = {str(d).split(":")[0] for v in values if (d := getattr(v.type, "device", None))}
    return sorted(devices or {"cpu"})


# -- casting a call's operands ---------------------------------------------------------


def cast_operands(
    tracer: Any,
    func: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    amp: tuple[tuple[str, torch.dtype], ...],
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``func``'s operands as autocast gives them to the op ([Note: autocast captured]):
    each eligible tensor (a proxy, or a real tensor, lifted first) cast by a recorded
    ``to`` call, by the policy of the device autocast is on for; unchanged when ``func``
    has no policy there."""
    for device, low in amp:
        if device in POLICIES:
            args, kwargs = _cast_for(tracer, func, args, kwargs, device, low)
    return args, kwargs


def _cast_for(
    tracer: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], device: str, low: torch.dtype
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    name = aten_name(func, args, kwargs)
    if name in BANNED.get(device, ()):
        raise CompileError(
            f"torch.{name} is not allowed under {device} autocast (torch raises for it)",
            tracer.source_loc(),
            f"call torch.nn.functional.{name}_with_logits, or leave autocast around it",
        )
    rule = POLICIES[device].get(name) if name else None
    if rule is None or (rule == FP32_UNLESS_DTYPE and _names_dtype(args, kwargs)):
        return args, kwargs
    leaves = [x for x in _tensors((args, kwargs)) if _eligible(x, device)]
    if not leaves:
        return args, kwargs
    if rule == LOWER:
        to = low
    elif rule in (FP32, FP32_UNLESS_DTYPE):
        to = torch.float32
    else:
        to = _dtype(leaves[0])
        for x in leaves[1:]:
            to = torch.promote_types(to, _dtype(x))

    def convert(x: Any) -> Any:
        if not (isinstance(x, torch.Tensor) and _eligible(x, device)) or _dtype(x) == to:
            return x
        if not hasattr(x, "ir_type"):  # a real tensor the code read: a graph input first
            x = tracer.lift(x)
        return tracer.handle(torch.Tensor.to, (x, to), {})

    return _map((args, kwargs), convert)


def _names_dtype(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """The call gives its result dtype (``x.sum(dtype=...)``, ``torch.softmax(x, 0, torch.half)``)."""
    return kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype) for a in args)


def _eligible(x: torch.Tensor, device: str) -> bool:
    """What autocast casts: floating tensors on its device, float64 excepted."""
    dtype = _dtype(x)
    return dtype.is_floating_point and dtype != torch.float64 and _device(x) == device


def _dtype(x: torch.Tensor) -> torch.dtype:
    """A proxy's dtype from its IR type (asking the proxy would be a traced call)."""
    ir = getattr(x, "ir_type", None)
    return ir.dtype.torch if ir is not None else x.dtype


def _device(x: torch.Tensor) -> str:
    ir = getattr(x, "ir_type", None)
    return str(ir.device).split(":")[0] if ir is not None else x.device.type


def _tensors(tree: Any) -> Iterator[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, (tuple, list)):
        for x in tree:
            yield from _tensors(x)
    elif isinstance(tree, dict):
        for x in tree.values():
            yield from _tensors(x)


def _map(tree: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, tuple):
        return tuple(_map(x, fn) for x in tree)
    if isinstance(tree, list):
        return [_map(x, fn) for x in tree]
    if isinstance(tree, dict):
        return {k: _map(v, fn) for k, v in tree.items()}
    return tree
