"""A picture of the per-GPU packing: one row per node, one cell per GPU.

Whole GPUs are one block; MIG GPUs show their instances on the 8 memory slices; shared
GPUs show the compute share of each pod. Colours by pod class.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from packing.catalog import get_model
from packing.model import GpuMode
from packing.simulate import SimResult

COLOURS = {
    "asr": "#4C72B0",
    "tts": "#DD8452",
    "small": "#55A868",
    "llm": "#C44E52",
    "whole": "#C44E52",
    "cpu": "#8172B2",
}
OTHER = "#937860"


def render(results: Sequence[SimResult], path: Path) -> Path:
    """Draw one panel per policy; returns the path written."""
    first = results[0].state
    rows = len(first.nodes)
    cols = max(len(n.gpus) for n in first.nodes.values())
    fig, axes = plt.subplots(
        1, len(results), figsize=(3.2 * len(results), 0.32 * rows + 1.2), squeeze=False
    )
    for ax, res in zip(axes[0], results, strict=True):
        klass = {p.key: p.klass for p, _ in res.placements}
        for r, node in enumerate(res.state.nodes.values()):
            y = rows - 1 - r
            for g in node.gpus:
                x = g.info.index
                ax.add_patch(Rectangle((x, y), 0.92, 0.8, fill=False, lw=0.5, ec="#999"))
                if g.whole_owner is not None:
                    ax.add_patch(
                        Rectangle(
                            (x, y),
                            0.92,
                            0.8,
                            color=COLOURS.get(klass.get(g.whole_owner, ""), OTHER),
                        )
                    )
                elif g.mode is GpuMode.MIG:
                    geom = get_model(g.info.model).mig
                    assert geom is not None
                    for start, (profile, owner) in g.instances.items():
                        size = geom.profile(profile).memory_slices / geom.memory_slices
                        colour = COLOURS.get(klass.get(owner or "", ""), OTHER) if owner else "#ddd"
                        ax.add_patch(
                            Rectangle(
                                (x + 0.92 * start / geom.memory_slices, y),
                                0.92 * size - 0.01,
                                0.8,
                                color=colour,
                            )
                        )
                else:
                    off = 0.0
                    for owner, (milli, _) in g.shared_owners.items():
                        w = 0.92 * milli / 1000
                        ax.add_patch(
                            Rectangle(
                                (x + off, y),
                                max(w - 0.01, 0.02),
                                0.8,
                                color=COLOURS.get(klass.get(owner, ""), OTHER),
                            )
                        )
                        off += w
            ax.text(-0.1, y + 0.4, node.info.name, ha="right", va="center", fontsize=6)
        s = res.summary
        ax.set_title(
            f"{res.policy} ({res.mode})\nplaced {res.pods_placed}/{res.pods_total}, "
            f"groups {res.groups_placed}/{res.groups_total}\nwhole GPUs free "
            f"{s.whole_gpus_free}, nodes free {s.whole_nodes_free}",
            fontsize=7,
        )
        ax.set_xlim(-0.1, cols)
        ax.set_ylim(-0.2, rows)
        ax.axis("off")
    handles = [Patch(color=c, label=k) for k, c in COLOURS.items() if k != "whole"]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7)
    fig.tight_layout(rect=(0.04, 0.05, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
