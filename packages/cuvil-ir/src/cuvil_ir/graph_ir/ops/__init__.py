"""Op declarations, one module per family; importing registers them."""

from cuvil_ir.graph_ir.ops import (
    activation,  # noqa: F401
    control,  # noqa: F401
    conv,  # noqa: F401
    core,  # noqa: F401
    elementwise,  # noqa: F401
    factory,  # noqa: F401
    index,  # noqa: F401
    linalg,  # noqa: F401
    nn,  # noqa: F401
    norm,  # noqa: F401
    paged,  # noqa: F401
    quant,  # noqa: F401
    reduction,  # noqa: F401
    shape,  # noqa: F401
)
from cuvil_ir.graph_ir.ops._rules import ShapeError  # a shape rule's error, for the frontend

__all__ = ["ShapeError"]
