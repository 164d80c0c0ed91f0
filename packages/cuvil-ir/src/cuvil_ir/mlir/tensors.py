"""Tensor building blocks: empty and filled tensors, ``linalg.generic`` with its
indexing maps, broadcasting maps and loop indices inside a generic's body."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cuvil_ir.graph_ir.types import TensorType
from cuvil_ir.mlir.module import elem, mlir_type
from cuvil_ir.mlir.sizes import SizeEmitter


class TensorBuilder(SizeEmitter):
    """Tensors and ``linalg.generic`` ops over them."""

    def dims_of(self, t: TensorType) -> list[str]:
        """SSA values of the dynamic dims of ``t`` (in order)."""
        return [self.idx(d) for d in t.shape if not isinstance(d, int)]

    def empty(self, t: TensorType) -> str:
        r = self.fresh("e")
        self.emit(f"{r} = tensor.empty({', '.join(self.dims_of(t))}) : {mlir_type(t)}")
        return r

    def filled(self, t: TensorType, value: float | int | bool) -> str:
        e = self.empty(t)
        c = self.const(value, t.dtype)
        r = self.fresh()
        self.emit(
            f"{r} = linalg.fill ins({c} : {elem(t.dtype)}) outs({e} : {mlir_type(t)}) -> {mlir_type(t)}"
        )
        return r

    def generic(
        self,
        outs: Sequence[tuple[str, TensorType, str]],
        ins: Sequence[tuple[str, TensorType, str]],
        rank: int,
        iterators: Sequence[str],
        body: Callable[[list[str], list[str]], list[str]],
    ) -> list[str]:
        """A linalg.generic; ``ins``/``outs`` are (ssa, type, map results); body gets block args."""
        dims = ", ".join(f"d{i}" for i in range(rank))
        maps = ", ".join(f"affine_map<({dims}) -> ({m})>" for _, _, m in [*ins, *outs])
        its = ", ".join(f'"{i}"' for i in iterators)
        results = [self.fresh() for _ in outs]
        head = f"{', '.join(results)} = linalg.generic {{indexing_maps = [{maps}], iterator_types = [{its}]}}"
        if ins:
            head += f" ins({', '.join(v for v, _, _ in ins)} : {', '.join(mlir_type(t) for _, t, _ in ins)})"
        head += (
            f" outs({', '.join(v for v, _, _ in outs)} : {', '.join(mlir_type(t) for _, t, _ in outs)}) {{"
        )
        self.emit(head)
        args = [self.fresh("a") for _ in (*ins, *outs)]
        types = [elem(t.dtype) for _, t, _ in (*ins, *outs)]
        self.emit("^bb0(" + ", ".join(f"{a}: {ty}" for a, ty in zip(args, types)) + "):")
        self.push()
        ys = body(args[: len(ins)], args[len(ins) :])
        self.emit(f"linalg.yield {', '.join(ys)} : {', '.join(elem(t.dtype) for _, t, _ in outs)}")
        self.pop()
        rt = ", ".join(mlir_type(t) for _, t, _ in outs)
        self.emit(f"}} -> ({rt})" if len(outs) > 1 else f"}} -> {rt}")
        return results

    def bmap(self, t: TensorType, out: TensorType) -> str:
        """Broadcasting map of operand ``t`` into loops over ``out``'s dims."""
        off = out.rank - t.rank
        res = []
        for i, d in enumerate(t.shape):
            o = out.shape[off + i]
            res.append("0" if self.is_one(d) and not self.is_one(o) else f"d{off + i}")
        return ", ".join(res)

    def index_in_body(self, i: int) -> str:
        r = self.fresh()
        self.emit(f"{r} = linalg.index {i} : index")
        return r


__all__ = ["TensorBuilder"]
