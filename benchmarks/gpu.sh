#!/usr/bin/env bash
# The GPU benchmark in one command, on a machine with an NVIDIA GPU and a Python that has
# a CUDA build of torch:
#
#     bash benchmarks/gpu.sh                 # from anywhere; results in benchmarks/results/
#     OUT=/some/dir bash benchmarks/gpu.sh --quick --workloads gelu_mlp,head
#
# Installs Cuvil's packages (editable) into a venv that reuses the machine's torch
# (--system-site-packages; $VENV, default .venv-gpu in the repo root, kept for the next
# run), triton too if torch did not bring it, then runs `python -m benchmarks.gpu` under
# `timeout 480` (the script's own budget is 420 s). Extra arguments go to benchmarks.gpu.
# PYTHON picks the interpreter (default: python3). USE_VENV=0 installs into it directly.
# DTYPES="float32 bfloat16 float16" runs the benchmark once per dtype (default: float32
# only), each under its own timeout, the half ones written to gpu_<dtype>_latest.*.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
OUT="${OUT:-benchmarks/results}"
say() { echo "[gpu.sh $(date -u +%H:%M:%S)] $*"; }

say "repo $ROOT; base python $(command -v "$PYTHON")"
"$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "GPU available:", torch.cuda.is_available())' \
  || { say "no importable torch in $PYTHON: install a CUDA build of torch first"; exit 2; }

if [[ "${USE_VENV:-1}" != 0 ]]; then
  VENV="${VENV:-$ROOT/.venv-gpu}"
  if [[ ! -x "$VENV/bin/python" ]]; then
    say "creating venv $VENV (--system-site-packages: reuses this machine's torch)"
    "$PYTHON" -m venv --system-site-packages "$VENV"
  fi
  PYTHON="$VENV/bin/python"
fi

PKGS=(packages/cuvil-ir packages/cuvil-runtime packages/cuvil-core packages/cuvil-backend-cuda)
EDITABLE=()
for p in "${PKGS[@]}"; do EDITABLE+=(-e "$p"); done
# --no-deps: pip must not replace the machine's CUDA torch (every dependency but triton
# comes with torch: sympy); --no-build-isolation when hatchling is here (no index needed)
PIP=("$PYTHON" -m pip install --quiet --no-deps --retries 0 --timeout 10)
if "$PYTHON" -c 'import hatchling, editables' 2>/dev/null; then PIP+=(--no-build-isolation); fi
say "pip install -e ${PKGS[*]}"
if ! "${PIP[@]}" "${EDITABLE[@]}"; then
  # offline and no hatchling: the same as an editable install by hand, a .pth file with
  # the src folders and dist-info folders with the entry points Cuvil discovers targets by
  say "pip could not build them (offline?): registering the src folders with a .pth file instead"
  "$PYTHON" - "$ROOT" "${PKGS[@]}" <<'PY'
import re, sys, sysconfig
from pathlib import Path
root, pkgs = Path(sys.argv[1]), sys.argv[2:]
site = Path(sysconfig.get_paths()["purelib"])
(site / "cuvil_dev_src.pth").write_text("".join(f"{root / p / 'src'}\n" for p in pkgs))
for p in pkgs:
    text = (root / p / "pyproject.toml").read_text()
    name = re.search(r'^name = "([^"]+)"', text, re.M).group(1)
    version = re.search(r'^version = "([^"]+)"', text, re.M).group(1)
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    eps = re.findall(r'^\[project\.entry-points\."([^"]+)"\]\n((?:[^\[\n].*\n)+)', text, re.M)
    (info / "entry_points.txt").write_text("".join(f"[{g}]\n{body}\n" for g, body in eps))
    print("registered", name, version, "from", root / p / "src")
PY
fi
if ! "$PYTHON" -c 'import triton' 2>/dev/null; then
  say "installing triton (torch did not bring it)"
  "$PYTHON" -m pip install --quiet triton || { say "triton is missing and could not be installed"; exit 2; }
fi
"$PYTHON" -c '
import torch, triton, cuvil
print("torch", torch.__version__, "| triton", triton.__version__, "| cuvil", cuvil.__file__)
for b in cuvil.backends():
    if b.name == "cuda":
        print("cuvil target cuda:", "available" if b.available else f"UNAVAILABLE: {b.reason}")
'
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

unset TRITON_INTERPRET
status=0
for dtype in ${DTYPES:-float32}; do
  extra=()
  stem=gpu_latest
  if [[ $dtype != float32 ]]; then extra=(--dtype "$dtype"); stem="gpu_${dtype}_latest"; fi
  say "running: python -m benchmarks.gpu --out $OUT ${extra[*]} $* (timeout 480 s)"
  one=0
  timeout 480 "$PYTHON" -m benchmarks.gpu --out "$OUT" "${extra[@]}" "$@" || one=$?
  [[ $one == 124 ]] && say "timed out after 480 s: $OUT/$stem.md holds what was measured"
  say "$dtype done (exit $one): $OUT/$stem.md, $OUT/$stem.json"
  [[ $one != 0 ]] && status=$one
done
exit "$status"
