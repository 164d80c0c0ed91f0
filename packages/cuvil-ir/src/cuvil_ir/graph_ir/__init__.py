"""Graph IR: the op graph the frontend captures (see :mod:`cuvil_ir`).

Importing this package (which Python does before any module of it) registers the
built-in ops and installs the printer, each with the module that cannot import it
without a cycle: the op declarations (:mod:`.ops`) import the registry, so the
registry cannot import them; the printer imports :mod:`.nodes`, so
``Graph.text``/``str(graph)`` reach it through ``nodes.PRINT_GRAPH``.
"""

from cuvil_ir.graph_ir import ops, printer  # noqa: F401  (registered, installed on import)
