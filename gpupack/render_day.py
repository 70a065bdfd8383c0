"""The picture of a day replay (``gpupack simulate``): what each scheduler needed and made
wait over the day, and how it packed the GPUs at the busiest moment.

Top: GPUs in use over the day and pods waiting over the day, one line per policy.
Below: one panel per policy with the per-GPU packing at the busiest moment (one row per
node, one box per GPU; colours by pod class; on a MIG GPU each bar is a slice as wide
as its memory slices, on a time-sliced GPU each bar a pod as wide as its compute share,
or its memory share when it declares no compute), and a legend. 1280 px wide.

The figure is drawn from :func:`picture_data` alone, and the PNG carries the SHA-256 of
that data and of this module's source (``Description``: ``gpupack-picture-sha256:...``)
so a test can tell that a PNG is what the current code draws for the current results
without comparing pixels (fonts and matplotlib versions move pixels).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.gridspec import GridSpec
from matplotlib.ticker import MaxNLocator

from gpupack.render import DPI, OTHER, WIDTH_PX, draw_legend, draw_nodes
from packing.day import DayResult
from packing.model import NodeInfo, Snapshot
from packing.state import ClusterState

HASH_KEY = "gpupack-picture-sha256:"
LINE = {"kube-scheduler": "#7f7f7f", "gpupack": "#2a7ab0"}
EXPLANATION = (
    "One row per node, one box per GPU.\n"
    "MIG GPU: each bar is a slice, as wide as its\n"
    "share of the GPU's memory slices.\n"
    "Time-sliced GPU: each bar is a pod, as wide as\n"
    "its compute share (else its memory share).\n"
    "Whole GPU: one pod fills the box."
)


def picture_data(results: Sequence[DayResult], nodes: Sequence[NodeInfo]) -> dict[str, Any]:
    """Everything the picture shows, as plain data (sorted, rounded: deterministic)."""
    out: dict[str, Any] = {"nodes": [[n.name, len(n.gpus)] for n in nodes], "policies": []}
    for r in results:
        out["policies"].append({
            "policy": r.policy,
            "busiest_at": r.busiest_at,
            "series": [[s.t, s.gpus_in_use, s.pending, s.groups_waiting] for s in r.series],
            "busiest": sorted([req.key, req.klass, p.node, list(p.gpus), p.mig_profile,
                               p.mig_start] for req, p in r.busiest),
        })
    return out


def picture_hash(data: Mapping[str, Any]) -> str:
    """SHA-256 of the picture's data and of the code that draws it."""
    h = hashlib.sha256(json.dumps(data, sort_keys=True).encode())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _clock(t: float) -> str:
    return f"{int(t // 3600):02d}:{int(t % 3600 // 60):02d}"


def render_day(results: Sequence[DayResult], nodes: Sequence[NodeInfo], path: Path) -> Path:
    """Draw the picture (see the module docstring); returns the path."""
    data = picture_data(results, nodes)
    total_gpus = sum(len(n.gpus) for n in nodes)
    rows = len(nodes)
    cols = max((len(n.gpus) for n in nodes), default=1)
    width_in = WIDTH_PX / DPI
    packing_h = 0.24 * rows + 0.9
    fig = plt.figure(figsize=(width_in, 2.9 + packing_h))
    grid = GridSpec(2, len(results) + 1, figure=fig,
                    height_ratios=[2.9, packing_h], width_ratios=[1.0] * len(results) + [0.72])
    gpus_ax = fig.add_subplot(grid[0, 0])
    wait_ax = fig.add_subplot(grid[0, 1:len(results)] if len(results) > 1 else grid[0, 1])
    _draw_series(gpus_ax, wait_ax, results, total_gpus)
    for i, r in enumerate(results):
        _draw_packing(fig.add_subplot(grid[1, i]), r, nodes, rows, cols)
    draw_legend(fig.add_subplot(grid[:, len(results)]), EXPLANATION, fontsize=8.5,
                loc="center left", anchor=(0.0, 0.42))
    fig.tight_layout(pad=0.6, h_pad=1.2, w_pad=0.8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, metadata={"Description": HASH_KEY + picture_hash(data)})
    plt.close(fig)
    return path


def _draw_series(gpus_ax: Axes, wait_ax: Axes, results: Sequence[DayResult],
                 total: int) -> None:
    hours = [0, 6, 12, 18, 24]
    for r in results:
        colour = LINE.get(r.policy, OTHER)
        t = [s.t / 3600 for s in r.series]
        gpus_ax.step(t, [s.gpus_in_use for s in r.series], where="post", color=colour,
                     label=f"{r.policy} (peak {r.gpus_in_use_peak})")
        wait_ax.step(t, [s.pending for s in r.series], where="post", color=colour,
                     label=f"{r.policy}: pods (peak {r.pods_waiting_peak})")
        wait_ax.step(t, [s.groups_waiting for s in r.series], where="post", color=colour,
                     linestyle=":", label=f"{r.policy}: LLM groups (peak "
                                          f"{r.groups_waiting_peak})")
    gpus_ax.axhline(total, color="black", lw=0.8, linestyle="--")
    gpus_ax.text(23.8, total, f"{total} GPUs in the cluster", va="bottom", ha="right",
                 fontsize=8)
    gpus_ax.set_ylim(0, total * 1.15)
    gpus_ax.set_title("GPUs in use (holding at least one pod)", fontsize=9)
    wait_ax.set_title("Waiting: pods pending, LLM groups not running whole", fontsize=9)
    for ax in (gpus_ax, wait_ax):
        ax.set_xlim(0, 24)
        ax.set_xticks(hours, [f"{h:02d}:00" for h in hours], fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    gpus_ax.legend(fontsize=8, loc="lower center", frameon=False)
    wait_ax.legend(fontsize=8, loc="upper left", frameon=False)
    wait_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    top = max((max((s.pending for s in r.series), default=0) for r in results), default=0)
    wait_ax.set_ylim(0, max(4, top * 1.4))


def _draw_packing(ax: Axes, r: DayResult, nodes: Sequence[NodeInfo], rows: int,
                  cols: int) -> None:
    state = ClusterState(Snapshot(tuple(nodes), r.busiest))
    klass = {req.key: req.klass for req, _ in r.busiest}
    memory = {req.key: req.gpu_memory_mib for req, _ in r.busiest}
    draw_nodes(ax, state.nodes.values(), rows, klass, memory, name_size=7.5)
    at = next((s for s in r.series if s.t >= r.busiest_at), None)
    waiting = f", {_count(at.pending, 'pod')} waiting" if at is not None else ""
    used = at.gpus_in_use if at is not None else 0
    ax.set_title(f"{r.policy} at {_clock(r.busiest_at)}, the busiest moment:\n"
                 f"{_count(len(r.busiest), 'pod')} running on {used} GPUs{waiting}",
                 fontsize=9)
    ax.set_xlim(-2.4, cols)
    ax.set_ylim(-0.2, rows)
    ax.axis("off")


def png_hash(path: Path) -> str | None:
    """The picture hash a PNG written by :func:`render_day` carries, or None."""
    data = path.read_bytes()
    pos = 8
    while pos + 8 <= len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            text = value.decode("latin-1")
            if key == b"Description" and text.startswith(HASH_KEY):
                return text[len(HASH_KEY):]
        pos += 12 + length
    return None
