"""What every Triton target shares at run time: the portable part of the device
library generated kernels call as ``cu.<name>`` (:mod:`.devicelib`) and loading a
generated kernel's text (:mod:`.load`).

These modules import ``triton`` -- whichever the host has: upstream Triton (the
``cuda`` target, and the ``ascend`` target's simulation in Triton's interpreter)
or a vendor's build of it (triton-ascend). Nothing else in ``cuvil_runtime``
imports them; a Triton target does, when it is first used.
"""
