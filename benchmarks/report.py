"""Render benchmark results: a markdown table and a PNG bar chart.

    python -m benchmarks.report [benchmarks/results/latest.json]   re-render latest.md/.png

``benchmarks.run`` calls :func:`write_all`. matplotlib is optional: without it
the chart is skipped with a message.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

COLUMNS = [
    "workload",
    "eager ms",
    "torch.compile ms",
    "cuvil ms",
    "x vs eager",
    "x vs torch.compile",
    "onnxruntime ms",
    "x vs ort",
    "bound ms",
    "cuvil x bound",
    "ort x bound",
    "cuvil cold s",
    "tc cold s",
    "cuvil warm first call s",
    "tc warm s",
    "peak RSS MB (eager/tc/cuvil)",
    "compiles in sweep (cuvil/tc)",
    "correct",
]


def _median(entry: dict[str, Any], impl: str) -> float | None:
    value = entry.get("impls", {}).get(impl, {}).get("median_ms")
    return float(value) if value is not None else None


def _ok(entry: dict[str, Any], impl: str) -> bool:
    return entry.get("correct", {}).get(impl) == "ok"


def ratio(entry: dict[str, Any], base: str, impl: str) -> float | None:
    """base time / impl time: above 1 means ``impl`` is faster than ``base``."""
    b, i = _median(entry, base), _median(entry, impl)
    if b is None or i is None or i <= 0:
        return None
    return b / i


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _fmt_ms(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _fmt_s(child: dict[str, Any] | None) -> str:
    if not child:
        return "-"
    if "error" in child:
        return "error"
    value = child.get("first_call_s")
    if value is None:
        return "-"
    text = f"{value:.2f}" if value < 10 else f"{value:.1f}"
    return f"{text} (fallback)" if child.get("fallbacks") else text


def _fmt_x(value: float | None, valid: bool = True) -> str:
    if value is None:
        return "-"
    text = f"{value:.2f}x"
    return text if valid else f"({text})"


def _rss(child: dict[str, Any] | None) -> str:
    if not child or child.get("peak_rss_mb") is None:
        return "-"
    if "error" in child:
        return "err"
    return f"{child['peak_rss_mb']:.0f}"


def _compiles(entry: dict[str, Any]) -> str:
    sweep = entry.get("sweep")
    if not sweep:
        return "-"
    c = sweep.get("cuvil_compiles", "err")
    t = sweep.get("tc_compiles", "err")
    return f"{c}/{t}"


def _correct(entry: dict[str, Any]) -> str:
    correct = entry.get("correct", {})
    problems = []
    for impl, label in (("cuvil", "cuvil"), ("torch_compile", "tc")):
        state = correct.get(impl, "not run")
        if state != "ok":
            problems.append(f"{label}: {state}")
    text = "; ".join(p if len(p) <= 100 else p[:97] + "..." for p in problems) if problems else "yes"
    return text.replace("|", "\\|")


def _ort_state(entry: dict[str, Any]) -> str:
    """Why there is no onnxruntime number (no export, a failed session, a mismatch)."""
    state = entry.get("correct", {}).get("onnxruntime")
    if state is None:
        return "-"
    return "no export" if state.startswith("error") else "mismatch"


def _bound(entry: dict[str, Any]) -> str:
    """``copy 1.23`` / ``gemm 4.56``: the workload's bound (benchmarks/roofline.py) and its kind."""
    rl = entry.get("roofline") or {}
    if "bound_ms" not in rl:
        return "error" if "error" in rl else "-"
    return f"{rl['kind']} {_fmt_ms(rl['bound_ms'])}"


def _x_bound(entry: dict[str, Any], impl: str) -> str:
    """impl's median / the bound (1.00x: at the bound); in parentheses when its output did not match."""
    value = (entry.get("roofline") or {}).get(f"{impl}_x_bound")
    if value is None:
        return "-"
    return _fmt_x(value, _ok(entry, impl))


def row(entry: dict[str, Any]) -> list[str]:
    children = entry.get("children", {})
    vs_eager = ratio(entry, "eager", "cuvil")
    vs_tc = ratio(entry, "torch_compile", "cuvil")
    cuvil_ok, tc_ok = _ok(entry, "cuvil"), _ok(entry, "torch_compile")
    rss = "/".join(_rss(children.get(k)) for k in ("eager", "torch_compile_cold", "cuvil_cold"))
    return [
        entry["name"],
        _fmt_ms(_median(entry, "eager")),
        _fmt_ms(_median(entry, "torch_compile")),
        _fmt_ms(_median(entry, "cuvil")),
        _fmt_x(vs_eager, cuvil_ok),
        _fmt_x(vs_tc, cuvil_ok and tc_ok),
        _fmt_ms(_median(entry, "onnxruntime")) if _ok(entry, "onnxruntime") else _ort_state(entry),
        _fmt_x(ratio(entry, "onnxruntime", "cuvil"), cuvil_ok) if _ok(entry, "onnxruntime") else "-",
        _bound(entry),
        _x_bound(entry, "cuvil"),
        _x_bound(entry, "onnxruntime"),
        _fmt_s(children.get("cuvil_cold")),
        _fmt_s(children.get("torch_compile_cold")),
        _fmt_s(children.get("cuvil_warm")),
        _fmt_s(children.get("torch_compile_warm")),
        rss if rss != "-/-/-" else "-",
        _compiles(entry),
        _correct(entry),
    ]


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Geometric means of the speedups over the workloads where both sides are correct."""
    pairs = {
        "cuvil_vs_eager": ("eager", "cuvil", ["cuvil"]),
        "cuvil_vs_torch_compile": ("torch_compile", "cuvil", ["cuvil", "torch_compile"]),
        "cuvil_vs_onnxruntime": ("onnxruntime", "cuvil", ["cuvil", "onnxruntime"]),
        "torch_compile_vs_eager": ("eager", "torch_compile", ["torch_compile"]),
    }
    out: dict[str, Any] = {}
    for key, (base, impl, must_be_ok) in pairs.items():
        values = [
            r
            for e in results
            if all(_ok(e, m) for m in must_be_ok) and (r := ratio(e, base, impl)) is not None
        ]
        out[key] = {"geomean": geomean(values), "n": len(values)}
    return out


def _isa_line(m: dict[str, Any], cfg: dict[str, Any]) -> str:
    if "host_isa" not in m:
        return "- ISA: not recorded (a run from before `--isa`)"
    host = m.get("host_isa") or {}
    feats = ", ".join(f"{k} {'yes' if host.get(k) else 'no'}" for k in ("avx2", "avx512", "bf16")) or "?"
    cu = m.get("cuvil_isa")
    if not cu:
        built = "Cuvil's kernels: - (not the cpu target)"
    elif "error" in cu:
        built = f"Cuvil's cpu target unusable ({cu['error']})"
    else:
        built = (
            f"Cuvil's kernels built for `{cu['isa']}` ({cu['march']}, {cu['vector_bytes'] * 8}-bit vectors)"
        )
    return f"- ISA: host {feats}; `CUVIL_CPU_ISA={cfg.get('isa', 'native')}`: {built}"


def _rates_line(rates: dict[str, Any] | None) -> str:
    if not rates:
        return "- roofline: not measured (`--skip-roofline`, or a run from before it existed)"
    copies = ", ".join(f"{c['bytes'] >> 20} MiB {c['gbps']:.1f} GB/s" for c in rates.get("copy", []))
    g = rates.get("sgemm", {})
    return (
        f"- roofline rates (same run, {rates.get('threads', '?')} threads): copy `dst.copy_(src)` {copies} "
        f"(bytes read + written); SGEMM `torch.mm` {g.get('n', '?')}^3 fp32 {g.get('gflops', 0):.0f} GFLOP/s"
    )


def render_markdown(data: dict[str, Any]) -> str:
    m = data.get("machine", {})
    cfg = data.get("config", {})
    results = data.get("results", [])
    lines = [
        "# Cuvil benchmarks",
        "",
        f"- date: {m.get('date', '?')}; commit {m.get('git_commit', '?')}",
        f"- CPU: {m.get('cpu', '?')}; {m.get('logical_cpus', '?')} logical CPUs"
        + (f", {m['physical_cores']} physical cores" if m.get("physical_cores") else "")
        + (f" ({m['sockets']} socket(s) x {m['cores_per_socket']} cores)" if m.get("sockets") else "")
        + f"; torch threads used: {m.get('threads_used', '?')}",
        f"- torch {m.get('torch', '?')}; cuvil {m.get('cuvil', '?')}; Python {m.get('python', '?')}; {m.get('gcc', '?')}",
        f"- OS: {m.get('os', '?')}",
        _isa_line(m, cfg),
        _rates_line(data.get("roofline")),
        f"- dtype: {cfg.get('dtype', 'float32')} (modules `.to(dtype)`, float32 inputs cast; outputs compared "
        f"with eager's in the same dtype at rtol {cfg.get('rtol', '?')}, atol {cfg.get('atol', '?')})",
        f"- Cuvil target: `{cfg.get('target', '?')}`; torch.compile: inductor, default settings"
        + ("; **quick run** (short timings)" if cfg.get("quick") else ""),
        f"- command: `{cfg.get('command', '?')}`",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" if i in (0, len(COLUMNS) - 1) else "---:" for i in range(len(COLUMNS))) + "|",
    ]
    for entry in results:
        lines.append("| " + " | ".join(row(entry)) + " |")
    s = summary(results)
    lines += [""]

    def g(key: str) -> str:
        v = s[key]
        return f"{v['geomean']:.2f}x (n={v['n']})" if v["geomean"] else f"- (n={v['n']})"

    lines += [
        "Geometric mean of speedups (over workloads whose outputs match eager): "
        f"cuvil vs eager {g('cuvil_vs_eager')}, cuvil vs torch.compile {g('cuvil_vs_torch_compile')}, "
        f"torch.compile vs eager {g('torch_compile_vs_eager')}, cuvil vs onnxruntime {g('cuvil_vs_onnxruntime')} "
        "(onnxruntime: torch.onnx.export, InferenceSession with IOBinding, same thread count).",
        "",
        "Times are medians of steady-state calls in one process (implementations interleaved "
        "round-robin in ~20 ms blocks). `x vs eager` = eager ms / cuvil ms, `x vs torch.compile` = torch.compile ms / cuvil ms "
        "(above 1: Cuvil is faster; in parentheses when an output did not match). Cold / warm first call: "
        "the first call in a fresh process with an empty / already-filled compile cache, after the "
        "compiler's one-time imports (torch.compile: at torch.compile(); Cuvil: cu.warmup()). Peak RSS: "
        "eager child / torch.compile cold child / cuvil cold child. Compiles in sweep: graphs compiled "
        "while calling one fresh compiled callable at every size of the sweep (1 = no recompile). "
        "Bound: the larger of the copy-bound time (bytes read + written / copy bandwidth; for a copy-bound "
        "workload the median of a same-size copy timed in the same round-robin) and the GEMM-bound time "
        "(matmul/conv FLOPs / SGEMM rate, the 1024^3 mm timed in the same round-robin); `x bound` = that implementation's ms / bound ms (1.00x: at the bound). "
        "See benchmarks/README.md.",
        "",
        "## Workloads",
        "",
    ]
    for entry in results:
        sweep = entry.get("sweep") or {}
        sizes = ", ".join(str(x) for x in sweep.get("sizes", []))
        extra = f"; sweep over {sweep.get('axis')} {sizes}" if sizes else ""
        lines.append(f"- `{entry['name']}` ({entry.get('kind', '?')}): {entry.get('description', '')}{extra}")
    notes = _notes(results)
    if notes:
        lines += ["", "## Notes", ""] + notes
    return "\n".join(lines) + "\n"


def _notes(results: list[dict[str, Any]]) -> list[str]:
    notes = []
    for entry in results:
        name = entry["name"]
        for impl, info in entry.get("impls", {}).items():
            if "error" in info:
                notes.append(f"- `{name}` {impl}: {info['error']}")
        for key, child in entry.get("children", {}).items():
            if "error" in child:
                notes.append(f"- `{name}` child {key}: {child['error']}")
        sweep = entry.get("sweep") or {}
        for key in ("cuvil_error", "tc_error"):
            if key in sweep:
                notes.append(f"- `{name}` sweep {key[:-6]}: {sweep[key]}")
        for reason in sweep.get("cuvil_recompile_reasons", []):
            notes.append(f"- `{name}` cuvil recompile: {reason}")
        if sweep.get("tc_graph_breaks"):
            notes.append(f"- `{name}` torch.compile graph breaks in sweep: {sweep['tc_graph_breaks']}")
    return [n.replace("\n", " ") for n in dict.fromkeys(notes)]


def write_plot(data: dict[str, Any], path: Path) -> Path | None:
    """A grouped bar chart of speedup vs eager (torch.compile, Cuvil) per workload."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the chart (pip install matplotlib)", file=sys.stderr)
        return None
    results = data.get("results", [])
    if not results:
        return None
    names = [e["name"] for e in results]
    impls = [("torch_compile", "torch.compile (inductor)", "#4c72b0"), ("cuvil", "Cuvil", "#dd8452")]
    width = 0.38
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(names) + 2), 4.5))
    for i, (impl, label, color) in enumerate(impls):
        xs, ys, hatches = [], [], []
        for j, entry in enumerate(results):
            r = ratio(entry, "eager", impl)
            if r is None:
                continue
            xs.append(j + (i - 0.5) * width)
            ys.append(r)
            hatches.append("" if _ok(entry, impl) else "//")
        bars = ax.bar(xs, ys, width, label=label, color=color)
        for bar, hatch, y in zip(bars, hatches, ys):
            bar.set_hatch(hatch)
            ax.annotate(
                f"{y:.2f}", (bar.get_x() + bar.get_width() / 2, y), ha="center", va="bottom", fontsize=7
            )
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="eager")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right")
    ax.set_ylabel("speedup vs eager (higher is better)")
    m, cfg = data.get("machine", {}), data.get("config", {})
    ax.set_title(
        f"Cuvil (target {cfg.get('target', '?')}) vs torch.compile, steady state\n"
        f"{m.get('cpu', '?')}, {m.get('threads_used', '?')} threads, torch {m.get('torch', '?')}",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_all(data: dict[str, Any], out_dir: Path) -> list[Path]:
    """latest.json, latest.md and (with matplotlib) latest.png in ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data["summary"] = summary(data.get("results", []))
    paths = [out_dir / "latest.json", out_dir / "latest.md"]
    paths[0].write_text(json.dumps(data, indent=2))
    paths[1].write_text(render_markdown(data))
    png = write_plot(data, out_dir / "latest.png")
    if png is not None:
        paths.append(png)
    return paths


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    src = Path(args[0]) if args else Path(__file__).resolve().parent / "results" / "latest.json"
    data = json.loads(src.read_text())
    for path in write_all(data, src.parent):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
