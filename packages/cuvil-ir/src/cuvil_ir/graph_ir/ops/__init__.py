"""Op declarations, one module per family; importing registers them."""

from cuvil_ir.graph_ir.ops import core  # noqa: F401
from cuvil_ir.graph_ir.ops import elementwise  # noqa: F401
