"""``bench/openb_all.py``'s pure parts: the published means and the summary table."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("openb_all", ROOT / "bench" / "openb_all.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["openb_all"] = mod
    spec.loader.exec_module(mod)
    return mod


openb_all = _load()

HEADER = "workload,sc_policy,tune,seed,total_gpus,100,130"


def _csv(*rows: str) -> str:
    return "\n".join([HEADER, *rows]) + "\n"


def test_published_means_average_the_requested_seeds_only() -> None:
    text = _csv(
        "openb_pod_list_default,06-FGD,1.3,42,6212,90.0,95.0",
        "openb_pod_list_default,06-FGD,1.3,43,6212,92.0,96.0",
        "openb_pod_list_default,06-FGD,1.3,44,6212,10.0,10.0",  # seed not asked for
        "openb_pod_list_default,05-BestFit,1.3,42,6212,1.0,1.0",  # other policy
    )
    got = openb_all.published_means(text, "06-FGD", [42, 43])
    assert got == {"default": {100: 91.0, 130: 95.5}}


def test_published_means_drop_a_trace_missing_a_seed() -> None:
    text = _csv(
        "openb_pod_list_cpu250,06-FGD,1.3,42,6212,90.0,93.0",
        "openb_pod_list_gpushare100,06-FGD,1.3,42,6212,80.0,86.0",
        "openb_pod_list_gpushare100,06-FGD,1.3,43,6212,82.0,88.0",
    )
    assert set(openb_all.published_means(text, "06-FGD", [42, 43])) == {"gpushare100"}


def _row(alloc: float) -> dict[str, float]:
    return {"alloc_130": alloc, "decision_ms_mean": 0.5, "decision_ms_p99": 4.0}


@pytest.mark.parametrize(
    ("fgd", "ours", "gain", "cut", "wins"),
    [
        (95.0, 97.0, "+2.00", "+40%", 1),
        (97.0, 96.7, "-0.30", "-10%", 0),
        (90.0, 90.0, "+0.00", "+0%", 0),
    ],
)
def test_summary_row_gain_cut_and_win_count(
    fgd: float, ours: float, gain: str, cut: str, wins: int
) -> None:
    table = openb_all.summary_table(
        {"default": {"fgd": _row(fgd), "gpupack": _row(ours)}}, {"default": {130: 95.4}}
    )
    row = table.splitlines()[2].split(" | ")
    assert row[3] == f"{fgd - 95.4:+.2f}"
    assert row[5] == gain and row[6] == cut
    assert table.endswith(f"gpupack above fgd at 130% on {wins} of 1 traces.")


def test_summary_without_published_figure_shows_a_dash() -> None:
    table = openb_all.summary_table({"cpu0": {"fgd": _row(95.0), "gpupack": _row(96.0)}}, {})
    assert "| cpu0 | 95.00 | - | - | 96.00 |" in table


def test_unknown_trace_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    # A trace directory of its own, so that the check does not depend on what ships.
    traces = tmp_path / "openb"
    traces.mkdir(parents=True)
    (traces / "openb_pod_list_default.csv").write_text("name\n")
    monkeypatch.setattr(openb_all.bundled, "trace_dir", lambda: traces)
    assert openb_all.main(["--traces", "nosuchtrace", "--seeds", "1"]) == 2
    err = capsys.readouterr().err
    assert "unknown --traces nosuchtrace; known: default" in err


def test_family_table_groups_traces_by_name_without_number() -> None:
    results = {
        "multigpu20": {"fgd": _row(95.0), "gpupack": _row(95.3)},
        "multigpu40": {"fgd": _row(96.0), "gpupack": _row(95.9)},
        "default": {"fgd": _row(95.0), "gpupack": _row(95.2)},
    }
    rows = openb_all.family_table(results).splitlines()
    assert rows[2] == "| default | 1 | +0.20 | +0.20 | 1 of 1 |"
    assert rows[3] == "| multigpu | 2 | +0.10 | -0.10 | 1 of 2 |"
    assert openb_all.family("gpushare100") == "gpushare"


def test_policy_table_lists_every_policy() -> None:
    results = {"cpu050": {"fgd": _row(95.0), "gpupack": _row(95.5), "bestfit": _row(93.0)}}
    assert openb_all.policy_table(results).splitlines() == [
        "| trace | fgd | gpupack | bestfit |",
        "|---|---|---|---|",
        "| cpu050 | 95.00 | 95.50 | 93.00 |",
    ]
