"""Read the text written by :mod:`.printer` back into a :class:`Graph`.

print → parse → print is the identity on canonical text (tested on the corpus).
"""

from __future__ import annotations

import json

import sympy

from cuvil_ir.graph_ir.nodes import KV, AttrValue, Block, Graph, Loc, Node, Ref, Value
from cuvil_ir.graph_ir.types import DType, ScalarKind, ScalarType, TensorType, Type
from cuvil_ir.symbolic import parse_dim, parse_expr

_DTYPES = {d.value: d for d in DType}
_CLOSE = {"(": ")", "[": "]", "{": "}", "<": ">"}


class ParseError(ValueError):
    def __init__(self, msg: str, text: str, pos: int) -> None:
        line = text.count("\n", 0, pos) + 1
        col = pos - (text.rfind("\n", 0, pos) + 1) + 1
        src = text.splitlines()[line - 1] if text.splitlines() else ""
        super().__init__(f"line {line}:{col}: {msg}\n  {src}\n  {' ' * (col - 1)}^")


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.scopes: list[dict[str, Value]] = [{}]

    # -- lexical helpers -------------------------------------------------
    def error(self, msg: str) -> ParseError:
        return ParseError(msg, self.s, self.i)

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \t\r\n":
            self.i += 1

    def peek(self, tok: str) -> bool:
        self.ws()
        return self.s.startswith(tok, self.i)

    def eat(self, tok: str) -> bool:
        if self.peek(tok):
            self.i += len(tok)
            return True
        return False

    def expect(self, tok: str) -> None:
        if not self.eat(tok):
            raise self.error(f"expected {tok!r}")

    def word(self) -> str:
        self.ws()
        j = self.i
        while j < len(self.s) and (self.s[j].isalnum() or self.s[j] in "_."):
            j += 1
        if j == self.i:
            raise self.error("expected a name")
        w, self.i = self.s[self.i : j], j
        return w

    def balanced(self, stop: str) -> str:
        """Text up to the first ``stop`` character at bracket depth 0."""
        self.ws()
        depth, j = 0, self.i
        while j < len(self.s):
            ch = self.s[j]
            if depth == 0 and ch in stop:
                break
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
            j += 1
        out, self.i = self.s[self.i : j].strip(), j
        return out

    # -- values and types ------------------------------------------------
    def value_name(self) -> str:
        self.expect("%")
        return self.word()

    def use(self) -> Value:
        name = self.value_name()
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        raise self.error(f"use of undefined value %{name}")

    def define(self, name: str, t: Type) -> Value:
        if any(name in s for s in self.scopes):
            raise self.error(f"value %{name} defined twice")
        v = Value(name, t)
        self.scopes[-1][name] = v
        return v

    def type(self) -> Type:
        kind = self.word()
        self.expect("[")
        if kind == "Scalar":
            k = ScalarKind(self.word())
            self.expect("]")
            return ScalarType(k)
        if kind != "Tensor":
            raise self.error(f"unknown type {kind!r}")
        dtype = _DTYPES[self.word()]
        self.expect(",")
        self.expect("(")
        dims = []
        while not self.eat(")"):
            dims.append(parse_dim(self.balanced(",)")))
            self.eat(",")
        self.expect(",")
        device = self.balanced("]")
        self.expect("]")
        return TensorType(dtype, tuple(dims), device)

    # -- attributes ------------------------------------------------------
    def attr(self) -> AttrValue:
        self.ws()
        c = self.s[self.i] if self.i < len(self.s) else ""
        if c == "[":
            self.i += 1
            items = []
            while not self.eat("]"):
                items.append(self.attr())
                self.eat(",")
            return tuple(items)
        if c == "{":
            self.i += 1
            pairs: dict[str, AttrValue] = {}
            while not self.eat("}"):
                k = self.word()
                self.expect("=")
                pairs[k] = self.attr()
                self.eat(",")
            return KV.of(pairs)
        if c == "<":
            self.i += 1
            j = self.s.index(">", self.i)
            text, self.i = self.s[self.i : j], j + 1
            return parse_expr(text)
        if c == '"':
            dec = json.JSONDecoder()
            val, end = dec.raw_decode(self.s, self.i)
            self.i = end
            return str(val)
        if c == "$":
            self.i += 1
            return Ref(int(self.word()))
        text = self.balanced(",]}")
        if text in ("none", "true", "false"):
            return {"none": None, "true": True, "false": False}[text]
        if text in _DTYPES:
            return _DTYPES[text]
        if text in ("inf", "-inf", "nan"):
            return float(text)
        try:
            return int(text)
        except ValueError:
            pass
        try:
            return float(text)
        except ValueError:
            raise self.error(f"bad attribute value {text!r}") from None

    # -- structure -------------------------------------------------------
    def graph(self) -> Graph:
        self.expect("graph")
        self.expect("@")
        name = self.word()
        self.expect("(")
        inputs = []
        while not self.eat(")"):
            n = self.value_name()
            self.expect(":")
            inputs.append(self.define(n, self.type()))
            self.eat(",")
        self.expect("{")
        assumptions = []
        while self.eat("assume"):
            j = self.s.index("\n", self.i)
            assumptions.append(parse_expr(self.s[self.i : j].strip()))
            self.i = j
        nodes, outputs = self.body("return")
        self.expect("}")
        self.ws()
        if self.i != len(self.s):
            raise self.error("trailing text after graph")
        return Graph(name, tuple(inputs), nodes, outputs, tuple(assumptions))

    def body(self, terminator: str) -> tuple[tuple[Node, ...], tuple[Value, ...]]:
        nodes = []
        while not self.eat(terminator):
            nodes.append(self.node())
        results = []
        self.ws()
        while self.peek("%"):
            results.append(self.use())
            if not self.eat(","):
                break
        return tuple(nodes), tuple(results)

    def node(self) -> Node:
        names = []
        if self.peek("%"):
            while True:
                names.append(self.value_name())
                if not self.eat(","):
                    break
            self.expect("=")
        op = self.word()
        while self.s.startswith("::", self.i):  # a custom op: namespace::name
            self.i += 2
            op += "::" + self.word()
        self.expect("(")
        inputs = []
        while not self.eat(")"):
            inputs.append(self.use())
            self.eat(",")
        attrs: list[tuple[str, AttrValue]] = []
        if self.eat("{"):
            while not self.eat("}"):
                k = self.word()
                self.expect("=")
                attrs.append((k, self.attr()))
                self.eat(",")
        regions = []
        if self.eat("("):
            while not self.eat(")"):
                regions.append(self.block())
        types: list[Type] = []
        if self.eat(":"):
            types.append(self.type())
            while self.eat(","):
                types.append(self.type())
        if len(types) != len(names):
            raise self.error(f"{op}: {len(names)} results but {len(types)} types")
        loc = None
        if self.eat("loc("):
            dec = json.JSONDecoder()
            self.ws()
            file, self.i = dec.raw_decode(self.s, self.i)
            self.expect(":")
            line = int(self.word())
            self.expect(":")
            col = int(self.word())
            self.expect(")")
            loc = Loc(file, line, col)
        outputs = tuple(self.define(n, t) for n, t in zip(names, types))
        return Node(op, tuple(inputs), outputs, tuple(attrs), tuple(regions), loc)

    def block(self) -> Block:
        self.expect("^")
        self.word()
        self.expect("(")
        self.scopes.append({})
        args = []
        while not self.eat(")"):
            n = self.value_name()
            self.expect(":")
            args.append(self.define(n, self.type()))
            self.eat(",")
        self.expect("{")
        nodes, results = self.body("yield")
        self.expect("}")
        self.scopes.pop()
        return Block(tuple(args), nodes, results)


def parse_graph(text: str) -> Graph:
    return _Parser(text).graph()


def parse_type(text: str) -> Type:
    return _Parser(text).type()


__all__ = ["ParseError", "parse_graph", "parse_type", "sympy"]
