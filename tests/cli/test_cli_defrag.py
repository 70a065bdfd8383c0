"""`gpupack defrag` end to end, as a user runs it: the bundled example, the JSON shape,
the exit status (0 every group has a move, 1 some wait, 2 bad input)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "gpupack" / "examples"
NODES = EXAMPLES / "defrag-nodes.yaml"
PODS = EXAMPLES / "defrag-pods.yaml"


def gpupack(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpupack", *args], capture_output=True,
                          text=True, timeout=300)


def example_pods() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(PODS.read_text())
    return doc


def write(tmp: Path, doc: object) -> Path:
    p = tmp / "pods.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_the_example_plan_as_json() -> None:
    out = gpupack("defrag", "--nodes", str(NODES), "--pods", str(PODS), "--format", "json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert set(plan) == {"moves", "waiting"} and plan["waiting"] == []
    (move,) = plan["moves"]
    assert set(move) == {"group", "evictions", "frees", "cost"}
    assert move["group"] == "llm/vllm-70b/0"
    # Clique b is blocked by the bare notebook pod; clique a costs two 1-GPU evictions.
    assert sorted(e["pod"] for e in move["evictions"]) == ["speech/asr-7d9c-x2k4f",
                                                          "speech/tts-0"]
    for e in move["evictions"]:
        assert set(e) == {"pod", "node", "to"}
        assert e["node"].startswith("h100-a-") and e["to"].startswith("h100-b-")
    assert move["frees"] == {"h100-a-0": list(range(8)), "h100-a-1": list(range(8))}
    assert move["cost"] == 4000


def test_the_example_as_a_table() -> None:
    out = gpupack("defrag", "--nodes", str(NODES), "--pods", str(PODS))
    assert out.returncode == 0, out.stderr
    assert "group llm/vllm-70b/0: evict 2 pod(s), cost 4000" in out.stdout
    assert "speech/tts-0" in out.stdout


def test_a_group_that_waits_exits_1_with_its_reason(tmp_path: Path) -> None:
    doc = example_pods()
    for item in doc["items"]:
        if item["kind"] == "PodDisruptionBudget":  # the tts budget now allows nothing
            item["spec"] = {"minAvailable": 2, "selector": item["spec"]["selector"]}
        if item["metadata"]["name"].startswith("asr-"):
            del item["metadata"]["ownerReferences"]  # bare pods now
    out = gpupack("defrag", "--nodes", str(NODES), "--pods", str(write(tmp_path, doc)),
                  "--format", "json")
    assert out.returncode == 1, out.stderr
    plan = json.loads(out.stdout)
    assert plan["moves"] == []
    (w,) = plan["waiting"]
    assert w["group"] == "llm/vllm-70b/0"
    assert "without a controller that recreates them" in w["reason"]
    assert "at their PodDisruptionBudget's limit" in w["reason"]


def test_owner_kinds_can_be_added(tmp_path: Path) -> None:
    doc = example_pods()
    for item in doc["items"]:
        for ref in item["metadata"].get("ownerReferences", []):
            ref["kind"] = "InferenceService"
    pods = str(write(tmp_path, doc))
    assert gpupack("defrag", "--nodes", str(NODES), "--pods", pods).returncode == 1
    out = gpupack("defrag", "--nodes", str(NODES), "--pods", pods,
                  "--owner-kind", "InferenceService")
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["items"].append({"kind": "Service", "metadata": {"name": "s"}}),
         "pods.yaml: document 0 item 7: kind: expected Pod or PodDisruptionBudget"),
        (lambda d: d["items"][5]["spec"].update(maxUnavailable="lots"),
         "pods.yaml: PodDisruptionBudget speech/tts: spec.maxUnavailable: 'lots'"),
        (lambda d: d["items"][0]["metadata"].update(ownerReferences="rs"),
         "pods.yaml: Pod speech/asr-7d9c-x2k4f: metadata.ownerReferences: expected a list"),
        (lambda d: d["items"][0]["spec"]["containers"][0]["resources"]["requests"].update(
            cpu="lots"),
         "pods.yaml: Pod speech/asr-7d9c-x2k4f: spec.containers[0].resources.requests.cpu"),
    ],
)
def test_bad_input_exits_2_naming_file_object_and_field(
        tmp_path: Path, change: Any, message: str) -> None:
    doc = example_pods()
    change(doc)
    out = gpupack("defrag", "--nodes", str(NODES), "--pods", str(write(tmp_path, doc)))
    assert out.returncode == 2
    assert message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_a_missing_file_exits_2(tmp_path: Path) -> None:
    out = gpupack("defrag", "--nodes", str(NODES), "--pods", str(tmp_path / "none.yaml"))
    assert out.returncode == 2 and "none.yaml" in out.stderr


# ---- gpupack serve --defrag (acting on the active extender: docs/defrag.md) ---------------

def _serve_args(*argv: str) -> Any:
    import argparse

    from gpupack.serve_cmd import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


@pytest.mark.parametrize("argv, why", [
    ((), None),
    (("--defrag", "plan"), None),
    (("--defrag", "act", "--kubeconfig", "kc"), None),
    (("--defrag", "act"), "--defrag=act needs a cluster (--kubeconfig or --in-cluster)"),
    (("--defrag", "act", "--in-cluster", "--defrag-evictions-per-minute", "0"),
     "--defrag-evictions-per-minute must be at least 1"),
    (("--defrag", "plan", "--defrag-interval", "0"), "--defrag-interval must be positive"),
    (("--defrag", "act", "--in-cluster", "--defrag-consolidate", "01:00-05:00"), None),
    (("--defrag", "plan", "--defrag-consolidate", "01:00-05:00"),
     "--defrag-consolidate needs --defrag=act"),
    (("--defrag", "act", "--in-cluster", "--defrag-consolidate", "1am-5am"),
     "--defrag-consolidate '1am-5am': "),
])
def test_serve_defrag_arguments(argv: tuple[str, ...], why: str | None) -> None:
    from gpupack.serve_cmd import check_args

    got = check_args(_serve_args(*argv))
    assert got == why if why is None else (got is not None and got.startswith(why))


def test_serve_defrag_is_off_by_default() -> None:
    args = _serve_args()
    assert args.defrag == "off" and args.defrag_evictions_per_minute == 2


def test_serve_plan_mode_wires_the_defragmenter_in_front_of_the_cache() -> None:
    from gpupack.serve_cmd import Components
    from kube.defrag.inputs import PodOwners
    from scheduler.defrag.loop import Defragmenter

    c = Components(_serve_args("--defrag", "plan"))
    assert isinstance(c.defrag, Defragmenter) and c.defrag.mode == "plan"
    assert isinstance(c.tap.sink, PodOwners) and c.tap.sink.sink is c.cache
    assert c.defrag.evictor is None  # plan mode has nothing to evict with
    off = Components(_serve_args())
    assert off.defrag is None and off.tap.sink is off.cache
