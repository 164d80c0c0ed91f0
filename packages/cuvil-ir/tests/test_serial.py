"""cuvil_ir.serial: plain-data encoding details (the round trip of every corpus program is
packages/cuvil-backend-cpu/tests/test_program_cache.py)."""

from __future__ import annotations


def test_equal_symbols_encode_as_one_entry() -> None:
    """A tree holding the capture's ``x_0`` and an equal one decoded from a cache encodes
    as if it held one object: the same program gives the same bytes (artifact hashes)."""
    import sympy

    from cuvil_ir.serial import Codec
    from cuvil_ir.symbolic import symbol

    a = symbol("x_0")
    b = sympy.Symbol("x_0", **a.assumptions0)  # equal, but another object
    assert a == b and a is not b
    codec = Codec()
    assert codec.dumps((a, b)) == codec.dumps((a, a))
    back = codec.loads(codec.dumps((a + 1, b * 2)))
    assert back == (a + 1, a * 2)


def test_equal_immutable_values_encode_alike_whatever_is_shared() -> None:
    """Two equal tuples (or expressions) that are one object in one tree and two in another
    encode the same (saving one program twice gave different bytes: the second compile's
    caches returned one size tuple where the first made two); values Python calls equal but
    that differ (-0.0 and 0.0, 1 and True) are never merged, nor are lists (mutable)."""
    import sympy

    from cuvil_ir.serial import Codec
    from cuvil_ir.symbolic import symbol

    codec = Codec()
    s = symbol("x_0")
    t1, t2 = (s, 6), (s, 6)
    assert t1 is not t2
    assert codec.dumps([t1, t2]) == codec.dumps([t1, t1])
    e1, e2 = s * 2 + 1, sympy.Add(sympy.Mul(2, s), 1)
    assert codec.dumps((e1, e2)) == codec.dumps((e1, e1))
    back = codec.loads(codec.dumps(((-0.0,), (0.0,), (1,), (True,))))
    assert [type(v[0]) for v in back] == [float, float, int, bool]
    assert str(back[0][0]) == "-0.0" and str(back[1][0]) == "0.0"
    lists = codec.loads(codec.dumps(([1], [1])))
    assert lists == ([1], [1]) and lists[0] is not lists[1]
