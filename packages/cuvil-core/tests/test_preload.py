"""``import cuvil`` starts no background import: a caller importing torch's compiler
modules right after it (``torch.compile``, libraries importing ``torch._dynamo``)
could otherwise deadlock with it ([Note: no background imports] in ``cuvil``)."""

from __future__ import annotations

import subprocess
import sys

RACE = """
import torch
import cuvil as cu
import torch._inductor, torch._dynamo   # what torch.compile imports, right after import cuvil
f = torch.compile(lambda x: x * 2 + 1)
print(f(torch.ones(3)).tolist(), cu.warmup() >= 0)
"""


def test_torch_compile_right_after_import_cuvil():
    for _ in range(3):  # the race depends on timing: a few fresh processes
        done = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split("\n")[0] == "[3.0, 3.0, 3.0] True", done.stdout
