"""Cuvil's intermediate representations (Graph IR today; Tensor and Loop IR follow)."""

from cuvil_ir.graph_ir.nodes import KV, Block, Graph, Loc, Node, Ref, Value
from cuvil_ir.graph_ir.parser import ParseError, parse_graph, parse_type
from cuvil_ir.graph_ir.printer import print_graph
from cuvil_ir.graph_ir.registry import REGISTRY, Emitter, NotCaptured, Op
from cuvil_ir.graph_ir.types import DType, ScalarKind, ScalarType, TensorType, Type
from cuvil_ir.graph_ir.verifier import VerifyError, verify
from cuvil_ir.symbolic import Dim, ShapeContext, symbol

__all__ = [
    "KV",
    "Block",
    "DType",
    "Dim",
    "Emitter",
    "Graph",
    "Loc",
    "Node",
    "NotCaptured",
    "Op",
    "ParseError",
    "REGISTRY",
    "Ref",
    "ScalarKind",
    "ScalarType",
    "ShapeContext",
    "TensorType",
    "Type",
    "Value",
    "VerifyError",
    "parse_graph",
    "parse_type",
    "print_graph",
    "symbol",
    "verify",
]
