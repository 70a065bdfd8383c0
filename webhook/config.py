"""Settings of the mutating webhook, passed in by the composition root (no globals)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from kube import annotations as A


class Isolation(StrEnum):
    """``gpupack.io/isolation``: which kind of GPU slice a small pod accepts."""

    MIG = "mig"  # hardware isolation only
    MPS = "mps"  # an MPS replica only: memory capped per client by the device plugin
    SHARED = "shared"  # a share: an MPS replica when one holds it, else time-sliced
    ANY = "any"  # MIG when available, else an MPS replica, else a time-sliced share


@dataclass(frozen=True)
class ClassDefault:
    """What a ``gpupack.io/class`` pod gets when it does not say ``gpu-memory`` itself."""

    memory_mib: int
    compute_milli: int = 0  # 0: no compute floor beyond what the memory implies


# Sizes of typical members of each class, in fp16: a Whisper large-v3 server with
# batching fits in 8 GiB; TTS models (VITS, XTTS, Piper) and embedders in 4 GiB. They map
# to the smallest MIG slice on 80 GB parts and to 1g.5gb/1g.10gb on A100-40GB.
DEFAULT_CLASSES: Mapping[str, ClassDefault] = MappingProxyType(
    {
        "asr": ClassDefault(memory_mib=8 * 1024),
        "tts": ClassDefault(memory_mib=4 * 1024),
        "small": ClassDefault(memory_mib=4 * 1024),
    }
)

# Class values that mean "whole GPUs, leave the pod's resources alone".
WHOLE_CLASSES = frozenset({"whole", "llm"})


def _no_labels(namespace: str) -> Mapping[str, str]:
    del namespace
    return {}


@dataclass(frozen=True)
class WebhookConfig:
    """Knobs of the webhook. Every field has a production default."""

    scheduler_name: str = "gpupack"
    # Resource the device plugin advertises for time-sliced replicas (renameByDefault).
    shared_resource: str = A.SHARED_RESOURCE
    default_isolation: Isolation = Isolation.ANY
    class_defaults: Mapping[str, ClassDefault] = field(default_factory=lambda: DEFAULT_CLASSES)
    # Labels of a namespace by name; the cluster shell passes its informer's lookup, the
    # static CLI a fixed table. Used only for the strict-mode opt-in.
    namespace_labels: Callable[[str], Mapping[str, str]] = field(default=_no_labels)

    def known_classes(self) -> frozenset[str]:
        return frozenset(self.class_defaults) | WHOLE_CLASSES
