"""The openb traces ship with gpupack (issue 36, item 8): checked, complete, readable
from a clone with nothing beside it."""

from __future__ import annotations

import io
import lzma
import tarfile
from pathlib import Path

import pytest

from sim.openb import bundled
from sim.traces import parse_nodes, parse_pods


def test_archive_holds_exactly_the_listed_files() -> None:
    data = (Path(bundled.__file__).parent / "data" / bundled.ARCHIVE).read_bytes()
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(data))) as tar:
        members = sorted(m.name for m in tar.getmembers())
    assert members == bundled.names()
    assert len(members) == 26
    assert {"default", "cpu250", "gpushare100", "multigpu50", "gpuspec33"} <= set(
        bundled.trace_names())


def test_default_trace_and_nodes_parse() -> None:
    nodes = parse_nodes(bundled.read_text(bundled.DEFAULT_NODES))
    pods = parse_pods(bundled.read_text("default"))
    assert len(nodes) == 1213  # the published protocol's GPU nodes
    assert sum(n.gpu_count for n in nodes) == 6212
    assert len(pods) == 8152


def test_published_series_has_the_fgd_rows() -> None:
    text = bundled.published_series()
    assert text.startswith("workload,sc_policy,tune,seed,total_gpus,0,1,")
    assert sum(",06-FGD," in line for line in text.splitlines()) > 100


def test_trace_dir_is_unpacked_once_and_checked(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPACK_CACHE", str(tmp_path))
    folder = bundled.trace_dir()
    assert folder.parent == tmp_path
    assert sorted(p.name for p in folder.iterdir()) == bundled.names()
    assert bundled.trace_dir() == folder  # reused
    # A damaged copy in the cache is replaced, not replayed.
    (folder / bundled.DEFAULT_PODS).write_text("name\n")
    again = bundled.trace_dir()
    assert (again / bundled.DEFAULT_PODS).read_text() == bundled.read_text("default")


def test_a_file_that_does_not_match_its_checksum_is_refused() -> None:
    with pytest.raises(bundled.BundleError, match="does not match SHA256SUMS"):
        bundled._checked(bundled.DEFAULT_PODS, b"name\n")
    with pytest.raises(bundled.BundleError, match="not listed"):
        bundled._checked("other.csv", b"")


def test_unknown_name_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="default"):
        bundled.read_text("nosuchtrace")
