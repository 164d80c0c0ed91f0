"""The program cache stores plain data: every corpus program's Tensor IR and C round-trip
through :mod:`cuvil_ir.serial` exactly, and a hostile entry is never executed."""

from __future__ import annotations

import json

import pytest

import cuvil as cu
from cuvil.testing import PROGRAMS, instantiate
from cuvil_backend_cpu.policy import FUSION
from cuvil_backend_cpu.target import CpuTarget
from cuvil_ir.serial import Codec, SerialError
from cuvil_ir.tensor_ir.lower import lower
from cuvil_runtime.pipeline import generate_all, program_codec
from cuvil_runtime.target import CompileOptions


def _graphs():
    for p in PROGRAMS:
        f = cu.compile(instantiate(p), target="reference", fallback="error")
        args, kwargs = p.call_args(0)
        try:
            f(*args, **kwargs)
        except cu.CompileError:
            continue
        yield p.name, f.graphs[0]


def test_every_corpus_program_round_trips():
    target = CpuTarget()
    codec = program_codec(target.codec_classes)
    count = 0
    for name, graph in _graphs():
        program = lower(graph, FUSION)
        generated = generate_all(target, program, CompileOptions())
        blob = codec.dumps((program, generated))
        back, back_gen = codec.loads(blob)
        assert back == program, name
        assert back.text == program.text, name
        assert back.plan == program.plan, name
        assert back_gen == generated, name
        assert {k: ck.source for k, ck in back_gen.items()} == {
            k: ck.source for k, ck in generated.items()
        }, name
        assert {k: ck.loop_ir for k, ck in back_gen.items()} == {
            k: ck.loop_ir for k, ck in generated.items()
        }, name
        count += 1
    assert count >= len(PROGRAMS) // 2


def test_sharing_follows_identity_not_equality():
    # -0.0 == 0.0 and 1 == True: merging equal values would change a program
    codec = Codec()
    back = codec.loads(codec.dumps((0.0, -0.0, 1, True, 1.0, [0.0], [-0.0])))
    assert [repr(x) for x in back] == ["0.0", "-0.0", "1", "True", "1.0", "[0.0]", "[-0.0]"]


@pytest.mark.parametrize(
    "doc",
    [
        b"\x80\x04cos\nsystem\n.",  # a pickle
        b"{}",
        b'{"format": 1, "table": [["D", "os.system", {}]], "root": ["@", 0]}',
        b'{"format": 1, "table": [["D", "builtins.eval", {"x": "1"}]], "root": ["@", 0]}',
        b'{"format": 1, "table": [["X", "Function", []]], "root": ["@", 0]}',
        b'{"format": 1, "table": [["X", "Add", ["__import__(\'os\')"]]], "root": ["@", 0]}',
        b'{"format": 1, "table": [["Y", "x", {"integer": "yes"}]], "root": ["@", 0]}',
        b'{"format": 1, "table": [["T", [["@", 5]]]], "root": ["@", 0]}',
        b'{"format": 1, "table": [], "root": ["@", 0]}',
    ],
)
def test_hostile_or_malformed_documents_are_refused(doc):
    with pytest.raises(SerialError):
        Codec().loads(doc)


def test_objects_outside_the_allowlist_are_not_encoded():
    class Thing:
        pass

    with pytest.raises(SerialError):
        Codec().dumps((1, Thing()))
    assert json.loads(Codec().dumps((1, "a")))["format"] == 1
