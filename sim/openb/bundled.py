"""The openb traces and the published FGD series, shipped with gpupack.

The data lives in ``sim/openb/data`` (source, citation and terms in its ``SOURCES.md``):
the 26 CSV files of Alibaba's ``cluster-trace-gpu-v2023`` in one xz-compressed tar, and
the paper's per-seed allocation series. Every file is checked against ``SHA256SUMS``
before it is used, so a damaged or altered copy is refused rather than replayed.

:func:`read_text` returns one file's text. :func:`trace_dir` unpacks the traces once
into a cache folder (``$GPUPACK_CACHE``, else ``$XDG_CACHE_HOME/gpupack``, else
``~/.cache/gpupack``; one subfolder per archive checksum) for tools that take paths;
the unpacking goes through a temporary folder renamed into place, so two processes
that start at once never see half a folder.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import lzma
import os
import shutil
import tarfile
import tempfile
from functools import cache
from pathlib import Path

ARCHIVE = "openb-v2023.tar.xz"
PUBLISHED = "fgd-analysis_allo_discrete.csv"
POD_PREFIX = "openb_pod_list_"
DEFAULT_PODS = "openb_pod_list_default.csv"
DEFAULT_NODES = "openb_node_list_gpu_node.csv"


class BundleError(RuntimeError):
    """The shipped data is missing or does not match its checksum."""


def _data() -> importlib.resources.abc.Traversable:
    return importlib.resources.files("sim.openb") / "data"


@cache
def checksums() -> dict[str, str]:
    """File name -> SHA-256 of its uncompressed bytes, from ``SHA256SUMS``."""
    out: dict[str, str] = {}
    for line in (_data() / "SHA256SUMS").read_text(encoding="utf-8").splitlines():
        digest, _, name = line.partition("  ")
        if digest and name:
            out[name.strip()] = digest.strip()
    return out


def names() -> list[str]:
    """The CSV files of the trace archive (node lists and pod lists), sorted."""
    return sorted(n for n in checksums() if n.startswith("openb_"))


def trace_names() -> list[str]:
    """Pod-list variants by short name: ``default``, ``cpu250``, ``gpushare100``, ..."""
    return [n.removeprefix(POD_PREFIX).removesuffix(".csv") for n in names()
            if n.startswith(POD_PREFIX)]


def _checked(name: str, data: bytes) -> bytes:
    want = checksums().get(name)
    if want is None:
        raise BundleError(f"{name}: not listed in sim/openb/data/SHA256SUMS")
    got = hashlib.sha256(data).hexdigest()
    if got != want:
        raise BundleError(f"{name}: SHA-256 {got} does not match SHA256SUMS ({want})")
    return data


@cache
def _members() -> dict[str, bytes]:
    """Every file of the trace archive, checked (0.04 s to unpack 12.9 MB)."""
    with (_data() / ARCHIVE).open("rb") as f, lzma.open(f) as xz, \
            tarfile.open(fileobj=xz, mode="r|") as tar:
        out: dict[str, bytes] = {}
        for member in tar:
            extracted = tar.extractfile(member) if member.isfile() else None
            if extracted is None:
                raise BundleError(f"{ARCHIVE}: {member.name} is not a plain file")
            out[member.name] = _checked(member.name, extracted.read())
    missing = sorted(set(names()) - set(out))
    if missing:
        raise BundleError(f"{ARCHIVE}: missing {', '.join(missing)}")
    return out


def read_text(name: str) -> str:
    """One trace file's text by file name (``openb_pod_list_default.csv``) or short pod
    list name (``default``); KeyError naming the known ones for any other."""
    if name in trace_names():
        name = f"{POD_PREFIX}{name}.csv"
    if name == PUBLISHED:
        return published_series()
    files = _members()
    if name not in files:
        raise KeyError(f"no bundled openb file {name!r}; known: {', '.join(trace_names())}")
    return files[name].decode("utf-8")


def published_series() -> str:
    """The paper's per-seed allocation series (``analysis_allo_discrete.csv``)."""
    with (_data() / f"{PUBLISHED}.xz").open("rb") as f:
        return _checked(PUBLISHED, lzma.decompress(f.read())).decode("utf-8")


def cache_root() -> Path:
    given = os.environ.get("GPUPACK_CACHE")
    if given:
        return Path(given)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "gpupack"


def trace_dir() -> Path:
    """A folder holding every trace CSV (checked), unpacked once per archive version."""
    digest = hashlib.sha256((_data() / ARCHIVE).read_bytes()).hexdigest()[:16]
    root = cache_root()
    final = root / f"openb-{digest}"
    if _complete(final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".openb-", dir=root))
    try:
        for name, data in _members().items():
            (tmp / name).write_bytes(data)
        try:
            tmp.rename(final)
        except OSError:  # another process put it there first, or an older partial copy
            if not _complete(final):
                shutil.rmtree(final, ignore_errors=True)
                tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _complete(folder: Path) -> bool:
    """Whether ``folder`` holds every trace file with its listed checksum."""
    try:
        return all(hashlib.sha256((folder / n).read_bytes()).hexdigest() == checksums()[n]
                   for n in names())
    except OSError:
        return False
