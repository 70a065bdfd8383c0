"""A picture of the per-GPU packing: one row per node, one box per GPU, one panel per
policy, and a legend panel saying what colours, bars and white space mean.

Whole GPUs are one block; MIG GPUs show their instances on the memory slices; shared
GPUs show the compute share of each pod. Colours by pod class. 1280 px wide.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.patches import Patch, Rectangle

from packing.catalog import get_model
from packing.model import GpuMode
from packing.simulate import SimResult
from packing.state import NodeState

COLOURS = {
    "asr": "#4C72B0",
    "tts": "#DD8452",
    "small": "#55A868",
    "llm": "#C44E52",
    "whole": "#C44E52",
}
OTHER = "#937860"
IDLE_SLICE = "#cccccc"  # a MIG instance that exists but no pod holds
OUTLINE = "#777777"
WIDTH_PX = 1280  # fits a laptop screen and a README column without scaling
DPI = 100
COLUMNS = 3  # panels per row; the last free cell holds the legend

# (colour, label) of the legend, in the order shown.
LEGEND: tuple[tuple[str, str], ...] = (
    (COLOURS["asr"], "ASR pod"),
    (COLOURS["tts"], "TTS pod"),
    (COLOURS["small"], "other small pod (embedder, ...)"),
    (COLOURS["llm"], "LLM / whole-GPU pod"),
    (OTHER, "pod of another class"),
    (IDLE_SLICE, "MIG slice created, unused"),
    ("white", "free: room no pod holds"),
)
EXPLANATION = (
    "One row per node, one box per GPU.\n"
    "MIG GPU: each bar is a slice, as wide as\n"
    "its share of the GPU's memory slices.\n"
    "Time-sliced GPU: each bar is a pod,\n"
    "as wide as its compute share.\n"
    "Whole GPU: one pod fills the box."
)


def legend_labels() -> list[str]:
    return [label for _, label in LEGEND]


def render(results: Sequence[SimResult], path: Path) -> Path:
    """Draw one panel per policy and a legend panel, 1280 px wide; returns the path."""
    first = results[0].state
    rows = len(first.nodes)
    cols = max(len(n.gpus) for n in first.nodes.values())
    panel_rows = (len(results) + 1 + COLUMNS - 1) // COLUMNS  # +1: the legend's cell
    width_in = WIDTH_PX / DPI
    fig, axes = plt.subplots(
        panel_rows, COLUMNS, figsize=(width_in, panel_rows * (0.27 * rows + 1.0)),
        squeeze=False,
    )
    cells = [ax for row in axes for ax in row]
    for ax, res in zip(cells, results, strict=False):
        _draw_policy(ax, res, rows, cols)
    for ax in cells[len(results):]:
        ax.axis("off")
    draw_legend(cells[len(results)])
    fig.tight_layout(pad=0.6, h_pad=1.0, w_pad=0.8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def draw_nodes(ax: Axes, nodes: Iterable[NodeState], rows: int, klass: Mapping[str, str],
               share_memory: Mapping[str, int] | None = None, name_size: float = 8) -> None:
    """One row per node, one box per GPU (see the module docstring). A time-sliced pod's
    bar is as wide as its compute share, or, when it declares none, as its GPU memory
    over the GPU's (``share_memory``: pod key -> MiB)."""
    for r, node in enumerate(nodes):
        y = rows - 1 - r
        for g in node.gpus:
            x = g.info.index
            if g.whole_owner is not None:
                colour = COLOURS.get(klass.get(g.whole_owner, ""), OTHER)
                ax.add_patch(Rectangle((x, y), 0.92, 0.8, color=colour))
            elif g.mode is GpuMode.MIG:
                geom = get_model(g.info.model).mig
                assert geom is not None
                for start, (profile, owner) in g.instances.items():
                    size = geom.profile(profile).memory_slices / geom.memory_slices
                    colour = (COLOURS.get(klass.get(owner, ""), OTHER) if owner
                              else IDLE_SLICE)
                    ax.add_patch(Rectangle((x + 0.92 * start / geom.memory_slices, y),
                                           0.92 * size - 0.01, 0.8, color=colour))
            else:
                off = 0.0
                for owner, (milli, _) in g.shared_owners.items():
                    share = milli / 1000
                    if not milli and share_memory is not None:
                        share = share_memory.get(owner, 0) / max(g.info.memory_mib, 1)
                    w = 0.92 * min(share, 1.0)
                    ax.add_patch(Rectangle((x + off, y), max(w - 0.01, 0.02), 0.8,
                                           color=COLOURS.get(klass.get(owner, ""), OTHER)))
                    off += w
            ax.add_patch(Rectangle((x, y), 0.92, 0.8, fill=False, lw=0.6, ec=OUTLINE))
        ax.text(-0.15, y + 0.4, node.info.name, ha="right", va="center", fontsize=name_size)


def _draw_policy(ax: Axes, res: SimResult, rows: int, cols: int) -> None:
    klass = {p.key: p.klass for p, _ in res.placements}
    draw_nodes(ax, res.state.nodes.values(), rows, klass)
    s = res.summary
    ax.set_title(
        f"{res.policy} ({res.mode}): {res.pods_placed}/{res.pods_total} pods, "
        f"{res.groups_placed}/{res.groups_total} LLM groups\n"
        f"{s.whole_gpus_free} whole GPUs free, {s.whole_nodes_free} whole nodes free",
        fontsize=9,
    )
    ax.set_xlim(-2.6, cols)
    ax.set_ylim(-0.2, rows)
    ax.axis("off")


def draw_legend(ax: Axes, explanation: str = EXPLANATION, fontsize: float = 9,
                loc: Literal["upper left", "center left"] = "upper left",
                anchor: tuple[float, float] | None = None) -> None:
    """The legend panel: what colours mean, and how to read a box."""
    ax.axis("off")
    handles = [Patch(facecolor=c, edgecolor=OUTLINE, label=label) for c, label in LEGEND]
    ax.legend(handles=handles, loc=loc, fontsize=fontsize, frameon=False,
              title="colour = what holds the room", title_fontsize=fontsize,
              bbox_to_anchor=anchor)
    ax.text(0.0, 0.0, explanation, transform=ax.transAxes, fontsize=fontsize - 0.5,
            va="bottom", ha="left", linespacing=1.3)
