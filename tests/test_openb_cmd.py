"""``gpupack simulate --trace openb`` shell: JSON shape, table, outputs, errors (smoke)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gpupack import openb_cmd
from sim.openb import bundled

TRACES = bundled.trace_dir()  # shipped with gpupack: no skip, no folder beside the clone


def _subset(tmp_path: Path, n_nodes: int = 60, n_pods: int = 400) -> tuple[Path, Path]:
    nodes = (TRACES / "openb_node_list_gpu_node.csv").read_text().splitlines()
    pods = (TRACES / "openb_pod_list_default.csv").read_text().splitlines()
    np_, pp = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    np_.write_text("\n".join(nodes[: n_nodes + 1]) + "\n")
    pp.write_text("\n".join(pods[: n_pods + 1]) + "\n")
    return np_, pp


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    openb_cmd.add_arguments(p)
    return p.parse_args(list(argv))


def test_json_smoke_random_below_bestfit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = _subset(tmp_path)
    out = tmp_path / "out"
    rc = openb_cmd.run(
        _args(
            "--pods",
            str(pods),
            "--nodes",
            str(nodes),
            "--policies",
            "random,bestfit,fgd,gpupack",
            "--seeds",
            "1",
            "--format",
            "json",
            "--out",
            str(out),
        )
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"policies"}
    assert set(doc["policies"]) == {"random", "bestfit", "fgd", "gpupack"}
    for row in doc["policies"].values():
        assert set(row) == {
            "alloc_100",
            "alloc_130",
            "frag_rate",
            "failed_pods",
            "decision_ms_mean",
            "decision_ms_p99",
        }
        assert 0.0 < row["alloc_130"] <= 100.0
    assert doc["policies"]["random"]["alloc_130"] < doc["policies"]["bestfit"]["alloc_130"]
    assert (out / "pods_alloc.png").stat().st_size > 0
    header = (out / "pods_series.csv").read_text().splitlines()[0].split(",")
    assert header[:2] == ["policy", "seed"] and header[-1] == "130"


def test_table_windowed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = _subset(tmp_path, 30, 200)
    rc = openb_cmd.run(
        _args(
            "--pods",
            str(pods),
            "--nodes",
            str(nodes),
            "--policies",
            "fgd",
            "--mode",
            "windowed",
            "--window",
            "8",
            "--out",
            str(tmp_path / "o"),
        )
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "| policy | alloc % @100 |" in text and "| fgd |" in text and "W=8" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--policies", "nope"], "unknown policy"),
        (["--pods", "/nonexistent/pods.csv"], "error"),
    ],
)
def test_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    bad_nodes = tmp_path / "n.csv"
    bad_nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,1,G2\n")
    good_pods = tmp_path / "p.csv"
    good_pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,1,1000\n")
    base = ["--nodes", str(bad_nodes), "--pods", str(good_pods), "--out", str(tmp_path / "o")]
    assert openb_cmd.run(_args(*base, *argv)) == 2
    assert message in capsys.readouterr().err


def test_bad_row_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = tmp_path / "n.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,x,G2\n")
    pods = tmp_path / "p.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,1,1000\n")
    rc = openb_cmd.run(_args("--nodes", str(nodes), "--pods", str(pods), "--out", str(tmp_path)))
    assert rc == 2
    err = capsys.readouterr().err
    assert "line 2" in err and "'gpu'" in err and "'x'" in err


def test_bound_beside_the_policies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The interface of issue 38: a top-level "bound" with exactly alloc_130 and kind,
    # above every policy's alloc_130 (it is a certificate, seed by seed and so in mean).
    nodes, pods = _subset(tmp_path, 40, 300)
    common = ("--pods", str(pods), "--nodes", str(nodes), "--policies", "bestfit,gpupack",
              "--seeds", "2", "--bound", "--out", str(tmp_path / "out"))
    assert openb_cmd.run(_args(*common, "--format", "json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"policies", "bound"}
    assert set(doc["bound"]) == {"alloc_130", "kind"} and doc["bound"]["kind"] == "certificate"
    for row in doc["policies"].values():
        assert row["alloc_130"] <= doc["bound"]["alloc_130"] + 0.01
    assert openb_cmd.run(_args(*common)) == 0
    assert "| bound (certificate) | - |" in capsys.readouterr().out
    assert openb_cmd.run(_args(*common, "--bound-lps", "0")) == 2
