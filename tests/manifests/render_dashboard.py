"""Render the main dashboard's queries into docs/dashboard.png.

    python tests/manifests/render_dashboard.py [OUT.png] [SECONDS]

Starts the same local stack as the tests (real Prometheus, real ``gpupack serve`` on the
bundled example cluster, real webhook, node agent on the recorded fake NVML), binds the
example's pending pods one by one through the extender's ``bind`` verb while Prometheus
scrapes, then evaluates every query of the "gpupack / Cluster GPU packing" dashboard
through Prometheus' HTTP API and draws the panels with matplotlib at their Grafana grid
positions. It is a rendering of the dashboard's queries on real metrics of this run, not
a Grafana screenshot.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stack import REPO, Stack, start, substitute

DASHBOARD = REPO / "manifests" / "base" / "dashboards" / "gpupack-cluster.json"
PERCENT = {"percentunit"}


def legend(fmt: str, metric: dict[str, str]) -> str:
    out = fmt
    for k, v in metric.items():
        out = out.replace("{{" + k + "}}", v)
    return out or ", ".join(f"{k}={v}" for k, v in metric.items() if k != "__name__")


def draw_panel(ax: Axes, panel: dict[str, Any], stack: Stack, t0: float, t1: float) -> None:
    unit = panel["fieldConfig"]["defaults"].get("unit", "short")
    scale = 100.0 if unit in PERCENT else 1.0
    suffix = " %" if unit in PERCENT else ""
    ax.set_title(panel["title"], fontsize=9, loc="left", color="#d8d9da")
    ax.set_facecolor("#181b1f")
    for spine in ax.spines.values():
        spine.set_color("#2c3235")
    ax.tick_params(colors="#9fa7b3", labelsize=7)
    kind = panel["type"]
    if kind == "stat":
        (target,) = panel["targets"]
        res = stack.query(substitute(target["expr"]), at=t1)
        value = float(res[0]["value"][1]) * scale if res else float("nan")
        ax.text(0.5, 0.45, f"{value:.0f}{suffix}" if scale != 1 or value >= 10 else
                f"{value:g}{suffix}", ha="center", va="center", fontsize=26,
                color="#73bf69", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    if kind == "bargauge":
        (target,) = panel["targets"]
        res = stack.query(substitute(target["expr"]), at=t1)
        rows = sorted((legend(target["legendFormat"], r["metric"]), float(r["value"][1]) * scale)
                      for r in res)
        labels = [r[0] for r in rows]
        values = [r[1] for r in rows]
        ax.barh(range(len(rows)), [100.0 if scale != 1 else max(values or [1])] * len(rows),
                color="#22252b")
        ax.barh(range(len(rows)), values, color=["#73bf69" if v < 50 else "#f2cc0c"
                                                 if v < 90 else "#f2495c" for v in values])
        ax.set_yticks(range(len(rows)), labels, fontsize=6)
        ax.invert_yaxis()
        ax.set_xlim(0, 100 if scale != 1 else None)
        return
    stacked = panel["fieldConfig"]["defaults"].get("custom", {}).get(
        "stacking", {}).get("mode") == "normal"
    series: list[tuple[str, list[float], list[float]]] = []
    for target in panel["targets"]:
        for r in stack.query_range(substitute(target["expr"]), t0, t1, 1.0):
            xs = [float(v[0]) - t0 for v in r["values"]]
            ys = [float(v[1]) * scale for v in r["values"]]
            series.append((legend(target["legendFormat"], r["metric"]), xs, ys))
    if stacked and series:
        grid = sorted({x for _, xs, _ in series for x in xs})
        layers = []
        for _, xs, ys in series:
            lookup = dict(zip(xs, ys, strict=True))
            layers.append([lookup.get(x, 0.0) for x in grid])
        ax.stackplot(grid, layers, labels=[s[0] for s in series], alpha=0.7)
    else:
        for name, xs, ys in series:
            ax.plot(xs, ys, label=name, linewidth=1.4)
    ax.set_xlim(0, t1 - t0)
    ax.set_xlabel("seconds into the run", fontsize=7, color="#9fa7b3")
    if suffix:
        ax.set_ylabel(suffix.strip(), fontsize=7, color="#9fa7b3")
    if series:
        ax.legend(fontsize=6, loc="upper left", framealpha=0.3, labelcolor="#d8d9da",
                  facecolor="#181b1f", ncol=2)
    ax.grid(color="#2c3235", linewidth=0.5)


def render(stack: Stack, out: Path, t0: float, t1: float) -> None:
    dash = json.loads(DASHBOARD.read_text())
    panels = dash["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig = plt.figure(figsize=(16, rows * 0.42 + 1.2), facecolor="#111217")
    grid = fig.add_gridspec(rows, 24, hspace=4.0, wspace=1.5, top=1 - 0.9 / (rows * 0.42 + 1.2),
                            bottom=0.03, left=0.06, right=0.99)
    for p in panels:
        g = p["gridPos"]
        ax = fig.add_subplot(grid[g["y"]:g["y"] + g["h"], g["x"]:g["x"] + g["w"]])
        draw_panel(ax, p, stack, t0, t1)
    fig.suptitle(f"{dash['title']} — a matplotlib rendering of the dashboard's PromQL queries "
                 "on metrics a real Prometheus scraped in the test stack (not a Grafana "
                 "screenshot)", color="#d8d9da", fontsize=11, x=0.01, ha="left")
    fig.savefig(out, dpi=90, facecolor=fig.get_facecolor())
    plt.close(fig)


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else REPO / "docs" / "dashboard.png"
    seconds = float(argv[2]) if len(argv) > 2 else 60.0
    with tempfile.TemporaryDirectory() as tmp:
        stack = start(Path(tmp))
        try:
            t0 = time.time()
            while time.time() - t0 < seconds:
                if time.time() - t0 > seconds * 0.3:
                    stack.drive_extender(bind=True)  # one pending pod placed per second
                else:
                    stack.drive_extender()
                stack.drive_webhook()
                time.sleep(1.0)
            time.sleep(2.0)
            render(stack, out, t0, time.time())
        finally:
            stack.stop()
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
