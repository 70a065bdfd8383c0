"""Read a cluster's Nodes and Pods once, read-only (``gpupack simulate --from-cluster``).

Only ``list`` calls are made (paged, ``limit``/``continue``, as kubectl pages), so an
identity allowed ``get``/``list`` on nodes and pods is enough, and nothing is written:
``tests/e2e/test_e2e_simulate_cluster.py`` runs it with such an identity and checks the
API server's audit log. The objects come back as the API server sends them (the JSON of
``kubectl get -o json``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

PAGE = 500


class ListingError(RuntimeError):
    """The cluster could not be read; the message says where (kubeconfig, API call)."""


def _paged(call: Callable[..., Any], what: str) -> list[dict[str, Any]]:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        kw: dict[str, Any] = {"limit": PAGE, "_preload_content": False, "_request_timeout": 60}
        if token:
            kw["_continue"] = token
        try:
            resp = call(**kw)
            body = json.loads(resp.data)
        except ApiException as e:
            raise ListingError(f"listing {what}: {e.status} {e.reason}") from None
        except (HTTPError, OSError, ValueError) as e:
            raise ListingError(f"listing {what}: {e}") from None
        items.extend(o for o in body.get("items") or [] if isinstance(o, dict))
        token = (body.get("metadata") or {}).get("continue") or None
        if not token:
            return items


def list_cluster(kubeconfig: str | None = None, context: str | None = None,
                 namespace: str | None = None, node_selector: str | None = None
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(nodes, pods) of the cluster of ``kubeconfig`` (default: ``$KUBECONFIG`` or
    ``~/.kube/config``) and ``context`` (default: its current one); pods of
    ``namespace`` only, nodes matching ``node_selector`` only, when given."""
    from kubernetes import client, config

    try:
        api = config.new_client_from_config(config_file=kubeconfig, context=context)
    except Exception as e:  # ConfigException, OSError, YAML errors: all mean "cannot"
        where = f"--kubeconfig {kubeconfig or '(default)'}"
        if context:
            where += f" --context {context}"
        raise ListingError(f"{where}: {e}") from None
    core = client.CoreV1Api(api)
    nodes = _paged(lambda **kw: core.list_node(label_selector=node_selector or "", **kw),
                   "nodes")
    if namespace:
        pods = _paged(lambda **kw: core.list_namespaced_pod(namespace, **kw),
                      f"pods in namespace {namespace}")
    else:
        pods = _paged(core.list_pod_for_all_namespaces, "pods")
    return nodes, pods
