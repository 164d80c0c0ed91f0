"""A ``call.json`` edited and re-hashed (so the integrity check passes) is refused at
load with an ArtifactError naming the file and the field, not a TypeError/KeyError/
IndexError on load or on the first call (issue 26 item 14b)."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils import _pytree as pytree

import cuvil as cu
from cuvil.aot import ArtifactError, _write


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    path = tmp_path_factory.mktemp("schema") / "m.cuvil"
    cu.save(cu.compile(m, target="reference"), path, torch.randn(2, 4))
    return path, m


def _rehashed(src: Path, dst: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """``src`` with call.json edited and its sha256 in the manifest updated (written by
    cu.save's own writer), so only the schema check can tell."""
    with zipfile.ZipFile(src) as z:
        members = {n: z.read(n) for n in z.namelist()}
    manifest = json.loads(members.pop("manifest.json"))
    call = json.loads(members["call.json"])
    edit(call)
    members["call.json"] = json.dumps(call).encode()
    manifest["hashes"]["call.json"] = hashlib.sha256(members["call.json"]).hexdigest()
    return _write(dst, manifest, members)


def test_an_unedited_rehashed_artifact_loads_and_matches_eager(saved, tmp_path):
    path, m = saved
    f = cu.load(_rehashed(path, tmp_path / "same.cuvil", lambda call: None))
    x = torch.randn(5, 4)
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x))


def _pop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda call: call.pop(key)


DAMAGE: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "an input removed": (lambda c: c["inputs"].pop(), r"inputs: the program takes 3 inputs"),
    "an input added": (
        lambda c: c["inputs"].append(copy.deepcopy(c["inputs"][1])),
        r"inputs: the program takes 3",
    ),
    "a missing key": (_pop("outputs"), r"call\.json: missing key\(s\) \['outputs'\]"),
    "an extra key": (lambda c: c.update(extra=1), r"call\.json: unexpected key\(s\) \['extra'\]"),
    "rank as a str": (
        lambda c: c["leaves"][0].update(rank="2"),
        r"leaves\[0\]\.rank: expected a non-negative int",
    ),
    "a leaf of no kind": (lambda c: c["leaves"][0].pop("kind"), r"leaves\[0\]\.kind"),
    "leaves not a list": (lambda c: c.update(leaves={}), r"leaves: expected a list"),
    "an output index out of range": (
        lambda c: c["outputs"][0].update(index=5),
        r"outputs\[0\]\.index: expected an index into the program's outputs",
    ),
    "an input leaf out of range": (
        lambda c: c["inputs"][0].update(leaf=3),
        r"inputs\[0\]\.leaf: expected an index",
    ),
    "an input leaf as a float": (lambda c: c["inputs"][0].update(leaf=0.0), r"inputs\[0\]\.leaf"),
    "a symbol's axis past the rank": (lambda c: c["symbols"][0].update(axis=9), r"symbols\[0\]\.axis"),
    "a parameter's shape transposed": (
        lambda c: c["inputs"][1].update(shape=[4, 3]),
        r"inputs\[1\]\.shape: \[4, 3\] does not fit the program's input self\.0\.weight",
    ),
    "a parameter's shape of strs": (lambda c: c["inputs"][2].update(shape=["3"]), r"inputs\[2\]\.shape"),
    "a parameter's file elsewhere": (
        lambda c: c["inputs"][1].update(file="graph.json"),
        r"inputs\[1\]\.file: the artifact has no tensor member 'graph\.json'",
    ),
    "an unknown dtype": (
        lambda c: c["inputs"][1].update(dtype="float99"),
        r"inputs\[1\]\.dtype: unknown dtype",
    ),
    "a signature not a list": (lambda c: c.update(signature="x"), r"signature: expected a list"),
    "a result tree of two leaves for one output": (
        lambda c: c.update(result=pytree.treespec_dumps(pytree.tree_structure((0, 0)))),
        r"result: the result tree has \d+ leaves, and outputs lists 1",
    ),
    "an argument tree that is not a spec": (lambda c: c.update(arguments="[1, {}]"), r"arguments/result"),
    "a layout's dims as strs": (lambda c: c["layouts"].append([0, ["a", 1], "input"]), r"layouts\[0\]\[1\]"),
    "a fixed size's axis past the rank": (
        lambda c: c["fixed"].append([0, 5, 3, "input"]),
        r"fixed\[0\]\[1\]",
    ),
    "a reason not a pair": (lambda c: c["reasons"].append("x"), r"reasons\[1\]"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_rehashed_damaged_call_json_is_an_artifact_error_naming_the_field(saved, tmp_path, case):
    path, _ = saved
    edit, field = DAMAGE[case]
    damaged = _rehashed(path, tmp_path / "damaged.cuvil", edit)
    with pytest.raises(ArtifactError, match=r"damaged: call\.json does not fit") as info:
        f = cu.load(damaged)
        f(torch.randn(2, 4))  # never reached: refused at load, not at the first call
    assert str(damaged) in str(info.value)
    assert re.search(field, str(info.value)), str(info.value)
