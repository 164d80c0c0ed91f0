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
