"""Lowering rules: each primitive Graph IR op as a composition of scalar expressions.

A rule is ``rule(lowering, node, *operands) -> value | [values]`` where operands
and values are :class:`~cuvil_ir.tensor_ir.values.Lazy` tensors or scalar
expressions. Raising :class:`~cuvil_ir.tensor_ir.values.NotLowered` makes the node
an extern call. A composite op (gelu, softmax, layer_norm ...) has no rule here: it
is lowered from its decomposition (:mod:`cuvil_ir.graph_ir.decompose`), its
primitives composed into one expression exactly as a rule would (see
:func:`~cuvil_ir.tensor_ir.rules.table.lower_decomposed`). Ops with neither (matmul,
conv, embedding ...) are externs; their declarations say why (``extern_reasons``).

The rules live by op family, each module registering its own into :data:`RULES`
(:mod:`.table`) when this package is imported:

* :mod:`.scalar` -- the rule of every elementwise op that declares its scalar
  function (``Op.scalar``: ``exp``, ``add``, ``maximum`` -> ``max``, ``eq`` ...),
  derived from the declaration, so such an op has no rule written out;
* :mod:`.elementwise` -- the other elementwise ops: ``round``, ``where``, ``pow``,
  ``square``, ``cast``, ``clamp``, ``relu``, ``tril``/``triu``;
* :mod:`.factories` -- scalar constants, ``full``, ``arange``;
* :mod:`.shapes` -- views, slicing, ``cat``, ``pad``, ``repeat``, ``reshape``;
* :mod:`.reductions` -- ``sum`` ... ``all``, ``mean``;
* :mod:`.nn` -- ``dropout``, ``interpolate``;

and :mod:`.helpers` holds what they share. No rule exists for linear algebra:
matmul, conv and the like are externs.
"""

from cuvil_ir.tensor_ir.rules import (  # noqa: F401  (each registers its rules)
    elementwise,
    factories,
    nn,
    reductions,
    shapes,
)
from cuvil_ir.tensor_ir.rules.table import RULES, Rule, lower_decomposed, rule

__all__ = ["RULES", "Rule", "lower_decomposed", "rule"]
