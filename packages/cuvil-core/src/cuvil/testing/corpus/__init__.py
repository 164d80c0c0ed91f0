"""A corpus of plain PyTorch inference programs, for testing compilers end to end.

Each :class:`Program` is a function, or a factory returning an ``nn.Module`` in
eval mode (weights from a fixed seed, ``requires_grad`` off, as inference code
runs), plus ``make_inputs(i)``: the example positional arguments of shape
variant ``i`` (``0 <= i < num_variants``). Variants differ in size on at least
one axis, so a compiler that keeps sizes symbolic can serve all of them with one
artifact. Inputs come from a seeded ``torch.Generator``: the same variant always
gives the same tensors, and the global RNG is never touched.

The programs use torch only (they never call ``cuvil``), so any compiler can run
them; the corpus ships with ``cuvil`` (the ``cuvil.testing`` kit). Use::

    from cuvil.testing.corpus import PROGRAMS, instantiate

    for p in PROGRAMS:
        f = instantiate(p)                  # the function, or a fresh module
        for i in range(p.num_variants):
            args, kwargs = p.call_args(i)
            expected = f(*args, **kwargs)

Rules for programs added here: no data-dependent Python control flow (no ``if``
on a tensor, no ``.item()``); Python ``if``/``for`` on sizes, plain ints and
config attributes is fine; small shapes (every program runs in milliseconds).

Layout: :mod:`.registry` holds the :class:`Program` record, the registration
decorators (:func:`program`, :func:`module`) and the seeded input helpers;
:mod:`.functions` registers the function programs and :mod:`.modules` the module
programs, in that order (the order of :data:`PROGRAMS`), when this package is imported.
"""

from cuvil.testing.corpus import functions, modules  # noqa: F401  (they register their programs)
from cuvil.testing.corpus.registry import PROGRAMS, Program, get_program, instantiate

__all__ = ["PROGRAMS", "Program", "get_program", "instantiate"]
