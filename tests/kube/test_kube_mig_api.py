"""The MIG actuator's ConfigMap I/O (kube/mig/api.py) with a fake CoreV1Api: a config.yaml
that cannot be read hides no change in flight and is never overwritten; gpupack's own
entries are kept while some node's label is unknown."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kube.mig.api import (
    CHANGES_KEY,
    CONFIG_KEY,
    MigApi,
    MigConfigError,
    merged_config,
    parse_config,
)


class FakeCore:
    def __init__(self, data: dict[str, str]) -> None:
        self.data = data
        self.replaced: list[dict[str, Any]] = []

    def read_namespaced_config_map(self, name: str, namespace: str, **_: Any) -> Any:
        return SimpleNamespace(data=dict(self.data),
                               metadata=SimpleNamespace(resource_version="7"))

    def replace_namespaced_config_map(self, name: str, namespace: str, body: Any,
                                      **_: Any) -> None:
        self.replaced.append(body)


def api(data: dict[str, str]) -> tuple[MigApi, FakeCore]:
    a = MigApi(None, "gpupack", "gpupack-mig-parted-config")
    core = FakeCore(data)
    a.core = core
    return a, core


CHANGES = '[{"node": "a", "config": "gpupack-x"}]'


@pytest.mark.parametrize("text", ["mig-configs: [1, 2]", "{", "mig-configs: {1: []}"])
def test_a_config_that_cannot_be_read_hides_no_change_and_is_not_overwritten(text: str
                                                                            ) -> None:
    a, core = api({CONFIG_KEY: text, CHANGES_KEY: CHANGES})
    config, changes, rv = a.read()
    assert isinstance(config, MigConfigError) and "config.yaml" in str(config)
    assert changes == CHANGES and rv == "7"
    with pytest.raises(MigConfigError):
        a.write(lambda cfg, ch: (cfg, ch))
    assert core.replaced == []


def test_a_readable_config_is_written_back_with_its_entries() -> None:
    a, core = api({CONFIG_KEY: "version: v1\nmig-configs:\n  all-disabled:\n"
                               "    - devices: all\n      mig-enabled: false\n",
                   CHANGES_KEY: ""})
    a.write(lambda cfg, ch: (merged_config(cfg, {"gpupack-y": []}, set()), CHANGES))
    (body,) = core.replaced
    written = parse_config(body["data"][CONFIG_KEY])
    assert set(written["mig-configs"]) == {"all-disabled", "gpupack-y"}
    assert body["data"][CHANGES_KEY] == CHANGES


def test_own_entries_are_kept_when_some_label_is_unknown() -> None:
    current = {"mig-configs": {"gpupack-old": [], "all-balanced": []}}
    assert set(merged_config(current, {}, set())["mig-configs"]) == {"all-balanced"}
    assert set(merged_config(current, {}, None)["mig-configs"]) == {"gpupack-old",
                                                                    "all-balanced"}
