"""The real control plane on loopback, for gpupack's end-to-end tests and benchmarks.

``control-plane.sh up DIR`` (this module's ``main``) starts, all on 127.0.0.1:

- etcd (data in ``DIR/etcd``),
- kube-apiserver with serving certificates and service-account keys generated into
  ``DIR/pki``, Node and RBAC authorization and the default admission plugins (which
  include MutatingAdmissionWebhook) plus NodeRestriction,
- the chart's (``manifests/helm/gpupack``) Namespace, ServiceAccounts, ClusterRoles,
  Roles and bindings, applied for real, and its MutatingWebhookConfiguration with the
  caBundle of ``manifests/tls/make-self-signed.sh`` and the Service reference replaced
  by the webhook's loopback URL (there is no Service network here),
- ``gpupack webhook --kubeconfig`` and ``gpupack serve --kubeconfig``, each with a token
  of its own ServiceAccount (the one the chart gives its container), so a missing or
  excess permission shows,
- kube-scheduler with the chart's KubeSchedulerConfiguration (only the extender URL and
  the client kubeconfig adjusted), as the chart's scheduler ServiceAccount,
- a second, plain kube-scheduler (no extender) whose profile is named
  ``plain-kube-scheduler``, for contrast runs of the same workload,
- the node agent (``gpupack agent``, the real command) with its test doubles for NVML
  and the kubelet's PodResources, reporting one Node, as the chart's agent ServiceAccount;
- a double of the GPU Operator's MIG manager (``mig_manager_double.py``, as the admin):
  it applies the mig-parted entries gpupack's MIG actuator asks for.

No kubelet runs: tests create Node objects and set their capacity through the status
subresource, as kube-scheduler's scheduler_perf does; pods are bound and never started.
kube-controller-manager runs only inside :func:`controllers` (the tests that need
ReplicaSets, Deployments or PodDisruptionBudget status) and, as a second instance with
only the resourceclaim controller, inside :func:`claim_controller` (the DRA tests), so
namespaces get no ``default`` ServiceAccount by themselves: :func:`ensure_namespace`
creates it with the namespace. No feature gate is set anywhere by default: DRA runs at
v1.37.2's defaults (structured parameters, prioritized lists, admin access, extended
resources and device taints GA; partitionable devices, consumable capacity and binding
conditions beta and on). ``up(feature_gates=..., runtime_config=...)`` starts a stack
that differs only there (the Workload API tests' second stack: ``GenericWorkload`` on
kube-apiserver, kube-scheduler and kube-controller-manager, ``scheduling.k8s.io/v1beta1``
served).

It writes ``DIR/kubeconfig`` (cluster admin), ``DIR/pids/<component>.pid``,
``DIR/logs/<component>.log`` and ``DIR/state.json`` (ports and each component's command,
so ``restart``/``start`` run exactly the same thing again). ``down`` stops exactly what
it started, by pid.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CHART = REPO / "manifests" / "helm" / "gpupack"
NAMESPACE = "gpupack"  # the release namespace the chart is rendered into
# The node agent's namespace (the chart's default: <release namespace>-node-agent, at
# Pod Security's privileged level; gpupack's own is restricted).
AGENT_NAMESPACE = f"{NAMESPACE}-node-agent"
RELEASE = "gpupack"
SCHEDULER_NAME = "gpupack"
PLAIN_SCHEDULER_NAME = "plain-kube-scheduler"
AGENT_NODE = "e2e-agent-node"
# Order of start; down stops in reverse. "controller-manager" and "claim-controller" are
# defined by up() but started only by the tests that need them (controllers(),
# claim_controller()).
COMPONENTS = ("etcd", "apiserver", "token-controller", "webhook", "extender", "scheduler",
              "extender-b", "scheduler-b", "plain-scheduler", "node-agent", "mig-manager",
              "controller-manager", "claim-controller")
# Chart values of the stack. The extender acts on waiting groups (docs/defrag.md), so its
# grants (events, pods/eviction) are applied and audited like the others; it evicts only
# pods a controller recreates: the tests' bare pods are never touched. The MIG actuator is
# on (its RBAC rendered and applied, and --mig-actuator on the extender and the webhook),
# with compaction (--mig-compact: it evicts only pods a controller recreates);
# it acts only on nodes labelled gpupack.io/mig-reconfigure: "true", which only
# tests/e2e/test_e2e_mig*.py create.
CHART_VALUES = ("--set", "defrag.mode=act", "--set", "migActuator.enabled=true",
                "--set", "migActuator.compact.enabled=true")
# The controllers a test may need (kube-controller-manager's names): ReplicaSets and
# Deployments recreate evicted pods, the disruption controller keeps PodDisruptionBudget
# status. Not the node lifecycle controller: the nodes here have no kubelet, and it
# would taint and evict them.
CONTROLLERS = ("replicaset-controller", "deployment-controller", "disruption-controller")
# The DRA tests' controller, in a kube-controller-manager of its own ("claim-controller")
# so that it may run beside the one above without either acting twice: it makes the
# ResourceClaims of pods' ResourceClaimTemplates, removes a deleted pod from a claim's
# reservedFor and then deallocates the claim (or deletes it, when it was the pod's).
DRA_CONTROLLERS = ("resourceclaim-controller",)
MIG_CONFIG_MAP = "gpupack-mig-parted-config"
# The extender's MIG settings for tests: an idle MIG GPU may change after 2 s (not 60);
# compaction moves pods of any age and acts from one GPU over the slice bound.
# A group reservation expires after 60 s (not 600): long enough for a member's bind
# across an extender restart or a failover (a 15 s lease), short enough to test what
# follows an expiry.
E2E_GROUP_TTL_S = 60
# The MIG manager double reads the ConfigMap as it was 3 s ago (the kubelet's copy; 1 min
# or more on a cluster); the extender labels a node 5 s after writing its entry (90 s by
# default): a change labelled at once would fail there, as it would on a cluster.
E2E_MIG_FILE_LAG_S = 3.0
# One namespace's reservations hold at most 64 GPUs (the chart's default is 50% of the
# cluster, which the small pools of these tests would make a few GPUs).
E2E_NAMESPACE_RESERVED_GPUS = 64
E2E_EXTENDER_ARGS = ("--mig-min-idle", "2", "--mig-compact-min-age", "0",
                     "--mig-compact-min-excess", "1", "--group-ttl", str(E2E_GROUP_TTL_S),
                     "--mig-config-propagation", "5",
                     "--max-namespace-reserved-gpus", str(E2E_NAMESPACE_RESERVED_GPUS))
# The name in the API server's client certificate for webhooks: the only caller the
# webhook acts on (the chart's webhook.clientAuth, set by up()).
WEBHOOK_CLIENT = "kube-apiserver-webhook-client"


def admission_config(dir_: Path, webhook_port: int) -> Path:
    """The API server's admission configuration: it presents the client certificate
    ``pki/webhook-client.crt`` to the webhook at 127.0.0.1:``webhook_port`` (the user
    is named after the webhook's host and port, as for a webhook called by URL)."""
    pki = dir_ / "pki"
    kubeconfig = dir_ / "config" / "webhook-client.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "users": [{"name": f"127.0.0.1:{webhook_port}", "user": {
            "client-certificate": str(pki / "webhook-client.crt"),
            "client-key": str(pki / "webhook-client.key")}}]}))
    config = dir_ / "config" / "admission.yaml"
    hook = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
            "kubeConfigFile": str(kubeconfig)}
    config.write_text(yaml.safe_dump({
        "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
        "plugins": [{"name": "MutatingAdmissionWebhook", "configuration": hook},
                    {"name": "ValidatingAdmissionWebhook", "configuration": hook}]}))
    return config


# Kinds of the chart applied to the API server. Workloads (Deployments, the DaemonSet),
# Services and monitoring objects are not: their processes run here directly.
APPLIED_KINDS = ("Namespace", "ServiceAccount", "Secret", "ClusterRole", "ClusterRoleBinding",
                 "Role", "RoleBinding", "ConfigMap", "MutatingWebhookConfiguration",
                 "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")

# Audit logs of other stacks started in this session (the Workload API tests' gated one):
# test_e2e_z_rbac.py counts what gpupack's accounts did there too.
EXTRA_AUDIT_LOGS: list[Path] = []

# Metadata of every request made by a ServiceAccount of gpupack's namespace; nothing else.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "userGroups": [f"system:serviceaccounts:{NAMESPACE}",
                                                   f"system:serviceaccounts:{AGENT_NAMESPACE}"]},
              {"level": "None"}],
}



def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` runs (zombies, exited but not reaped, do
    not count)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command name: state, ppid, pgrp.
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False

class StackError(RuntimeError):
    """The stack could not be started or driven; the message says which component."""


# -- small helpers ----------------------------------------------------------------------------


_GIVEN: set[int] = set()  # ports free_port handed out in this process


def free_port() -> int:
    """A loopback port nothing listens on, never one handed out before in this process:
    the kernel may give a port just released again, and two components of one stack (or
    of two stacks) would then both be told to listen on it."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def run(argv: Sequence[str], **kw: Any) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, **kw)
    if done.returncode != 0:
        raise StackError(f"{' '.join(argv)} exited {done.returncode}: "
                         f"{done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def build_binaries() -> Path:
    """The folder holding etcd, kube-apiserver and kube-scheduler (built once, cached)."""
    out = subprocess.run(["bash", str(HERE / "build.sh")], capture_output=True, text=True)
    if out.returncode != 0:
        raise StackError(f"tests/e2e/build.sh exited {out.returncode}: {out.stderr[-2000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


# -- certificates -------------------------------------------------------------------------------


def _openssl(*args: str) -> None:
    run(["openssl", *args])


def make_pki(pki: Path) -> None:
    """A CA, the API server's serving certificate, an admin client certificate
    (system:masters), a client certificate for the plain kube-scheduler
    (system:kube-scheduler) and the service-account signing key pair."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-new", "-nodes", "-newkey", "rsa:2048", "-sha256", "-days", "7",
             "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt"),
             "-subj", "/CN=gpupack-e2e-ca")

    def sign(name: str, subj: str, ext: str) -> None:
        _openssl("req", "-new", "-nodes", "-newkey", "rsa:2048", "-sha256",
                 "-keyout", str(pki / f"{name}.key"), "-out", str(pki / f"{name}.csr"),
                 "-subj", subj)
        (pki / f"{name}.ext").write_text(ext)
        _openssl("x509", "-req", "-sha256", "-days", "7", "-in", str(pki / f"{name}.csr"),
                 "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"), "-CAcreateserial",
                 "-extfile", str(pki / f"{name}.ext"), "-out", str(pki / f"{name}.crt"))

    sign("apiserver", "/CN=kube-apiserver",
         "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
         "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,"
         "DNS:kubernetes.default,DNS:kubernetes.default.svc\n")
    client_ext = "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"
    sign("admin", "/O=system:masters/CN=e2e-admin", client_ext)
    sign("plain-scheduler", "/CN=system:kube-scheduler", client_ext)
    sign("controller-manager", "/CN=system:kube-controller-manager", client_ext)
    # What the API server presents to the webhook (its admission configuration).
    sign("webhook-client", f"/CN={WEBHOOK_CLIENT}", client_ext)
    _openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
    _openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))


def write_kubeconfig(path: Path, server: str, ca: Path, *, token: str | None = None,
                     cert: Path | None = None, key: Path | None = None) -> None:
    user: dict[str, str] = {}
    if token is not None:
        user["token"] = token
    if cert is not None and key is not None:
        user["client-certificate"] = str(cert)
        user["client-key"] = str(key)
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "e2e",
        "clusters": [{"name": "e2e", "cluster": {"server": server,
                                                 "certificate-authority": str(ca)}}],
        "users": [{"name": "e2e", "user": user}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e"}}],
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)


# -- the chart ------------------------------------------------------------------------------------


def render_chart(ca_bundle_b64: str, extra: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The chart's objects as ``helm template`` renders them for this stack."""
    helm = shutil.which("helm")
    if helm is None:
        raise StackError("helm is not installed (tests/install-tools.sh installs it)")
    out = run([helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
               "--set", "namespace.create=true", "--set", "tls.source=secret",
               "--set", f"tls.caBundle={ca_bundle_b64}", *extra])
    return [d for d in yaml.safe_load_all(out) if isinstance(d, dict)]


def _find(objs: Sequence[Mapping[str, Any]], kind: str, name: str | None = None
          ) -> dict[str, Any]:
    for o in objs:
        if o.get("kind") == kind and (name is None or o["metadata"]["name"] == name):
            return dict(o)
    raise StackError(f"the chart renders no {kind}{' ' + name if name else ''}")


SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def service_accounts(objs: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Which ServiceAccount each gpupack process runs as, read from the chart's workloads:
    a container runs as the account whose token Secret it mounts where the client reads
    one (the extender, beside kube-scheduler), else as its pod's."""
    def sa_of(kind: str, component: str, container: str) -> str:
        for o in objs:
            labels = o.get("metadata", {}).get("labels", {})
            if o.get("kind") == kind and labels.get("app.kubernetes.io/component") == component:
                spec = o["spec"]["template"]["spec"]
                c = next(c for c in spec["containers"] if c["name"] == container)
                return token_secret_account(objs, spec, c) or str(spec["serviceAccountName"])
        raise StackError(f"the chart renders no {kind} for {component}")

    return {"scheduler": sa_of("Deployment", "scheduler", "kube-scheduler"),
            "extender": sa_of("Deployment", "scheduler", "extender"),
            "webhook": sa_of("Deployment", "webhook", "webhook"),
            "node-agent": sa_of("DaemonSet", "node-agent", "agent")}


def token_secret_account(objs: Sequence[Mapping[str, Any]], spec: Mapping[str, Any],
                         container: Mapping[str, Any]) -> str | None:
    """The account of the service-account-token Secret ``container`` mounts at the
    client's token path (None: none)."""
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for m in container.get("volumeMounts", []):
        secret = volumes.get(m["name"], {}).get("secret")
        if m["mountPath"] == SA_MOUNT and secret is not None:
            s = _find(objs, "Secret", secret["secretName"])
            return str(s["metadata"]["annotations"]["kubernetes.io/service-account.name"])
    return None


def token_secrets(objs: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """account -> the name of its service-account-token Secret in the chart."""
    return {str(o["metadata"]["annotations"]["kubernetes.io/service-account.name"]):
            str(o["metadata"]["name"]) for o in objs
            if o.get("kind") == "Secret" and o.get("type") == "kubernetes.io/service-account-token"}


def chart_command(objs: Sequence[Mapping[str, Any]], container: str,
                  replace: Mapping[str, str | None]) -> list[str]:
    """A gpupack container's command line as the chart renders it (``gpupack ...``), with
    the options in ``replace`` given new values (None: dropped, with its value if it has
    one). Options the chart does not give but ``replace`` names are appended."""
    for o in objs:
        if o.get("kind") not in ("Deployment", "DaemonSet"):
            continue
        for c in o["spec"]["template"]["spec"]["containers"]:
            if c["name"] == container:
                argv = list(c["command"]) + list(c.get("args") or [])
                break
        else:
            continue
        break
    else:
        raise StackError(f"the chart renders no container {container!r}")
    if argv[0] != "gpupack":
        raise StackError(f"container {container!r} does not run gpupack: {argv}")
    out: list[str] = []
    seen: set[str] = set()
    i = 1
    while i < len(argv):
        arg = argv[i]
        has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        if arg in replace:
            seen.add(arg)
            value = replace[arg]
            if value is not None:
                out += [arg, value] if has_value else [arg]
            i += 2 if has_value else 1
            continue
        out.append(arg)
        i += 1
    for arg, value in replace.items():
        if arg not in seen and value is not None:
            out += [arg] if value == "" else [arg, value]
    return _gpupack(*out)


def scheduler_config(objs: Sequence[Mapping[str, Any]], extender_port: int,
                     kubeconfig: Path) -> dict[str, Any]:
    """The chart's KubeSchedulerConfiguration with only the extender URL and the client
    kubeconfig adjusted."""
    for o in objs:
        if o.get("kind") == "ConfigMap" and "scheduler-config.yaml" in o.get("data", {}):
            config = yaml.safe_load(o["data"]["scheduler-config.yaml"])
            break
    else:
        raise StackError("the chart renders no ConfigMap with scheduler-config.yaml")
    for ext in config.get("extenders", []):
        ext["urlPrefix"] = f"http://127.0.0.1:{extender_port}"
    config.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig)
    return dict(config)


def plain_scheduler_config(kubeconfig: Path) -> dict[str, Any]:
    """Plain kube-scheduler (default plugins, no extender) under another profile name, so
    that the webhook, which turns the default scheduler's GPU pods into gpupack's, leaves
    its pods alone."""
    return {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "leaderElection": {"leaderElect": True, "resourceLock": "leases",
                               "resourceNamespace": "kube-system",
                               "resourceName": PLAIN_SCHEDULER_NAME},
            "profiles": [{"schedulerName": PLAIN_SCHEDULER_NAME}]}


def webhook_config_for_url(objs: Sequence[Mapping[str, Any]], url: str) -> dict[str, Any]:
    """The chart's MutatingWebhookConfiguration, reaching the webhook by URL."""
    config = json.loads(json.dumps(_find(objs, "MutatingWebhookConfiguration")))
    for hook in config["webhooks"]:
        cc = hook["clientConfig"]
        path = cc.pop("service")["path"]
        cc["url"] = url + path
    return dict(config)


# -- process control ---------------------------------------------------------------------------


@dataclass
class Stack:
    """A running (or stopped) stack in ``dir``; all state lives in ``dir/state.json``."""

    dir: Path

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    def state(self) -> dict[str, Any]:
        return dict(json.loads(self.state_file.read_text()))

    def save(self, state: Mapping[str, Any]) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.state_file)

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    def pid_file(self, component: str) -> Path:
        return self.dir / "pids" / f"{component}.pid"

    def log_file(self, component: str) -> Path:
        return self.dir / "logs" / f"{component}.log"

    def pid(self, component: str) -> int | None:
        try:
            return int(self.pid_file(component).read_text().strip())
        except (OSError, ValueError):
            return None

    def alive(self, component: str) -> bool:
        pid = self.pid(component)
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        # A zombie (exited, not reaped by a parent that is us) counts as dead.
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            return stat.rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    def start(self, component: str) -> None:
        """Start ``component`` with its saved command and wait until it is ready."""
        spec = self.state()["components"][component]
        if self.alive(component):
            raise StackError(f"{component} is already running (pid {self.pid(component)})")
        self.dir.joinpath("pids").mkdir(exist_ok=True)
        self.dir.joinpath("logs").mkdir(exist_ok=True)
        env = {**os.environ, **spec.get("env", {})}
        argv = list(spec["argv"])
        if spec.get("restart") == "always":
            # As the kubelet restarts a pod's container (restartPolicy Always): e.g.
            # kube-scheduler exits when it loses its lease during an API server outage.
            # The loop shares the process group, so stop/kill end it with the component.
            argv = ["bash", "-c", 'while :; do "$@"; echo "--- exited with $?; restarting '
                    'in 1 s"; sleep 1; done', "supervise", *argv]
        with open(self.log_file(component), "ab") as log:
            log.write(f"--- start {time.strftime('%H:%M:%S')}: {' '.join(spec['argv'])}\n"
                      .encode())
            log.flush()
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, cwd=spec.get("cwd"),
                                    start_new_session=True)
        self.pid_file(component).write_text(f"{proc.pid}\n")
        started = time.time()
        try:
            self.wait_ready(component, proc, float(spec.get("ready_timeout_s", 120.0)))
        except BaseException:
            # Not ready (or interrupted): what was started is stopped, not left behind.
            self.stop(component)
            raise
        state = self.state()
        state["components"][component].setdefault("history", []).append([started, time.time()])
        self.save(state)

    def starts(self, component: str) -> list[tuple[float, float]]:
        """(started, ready) wall-clock times of each start of ``component``."""
        spec = self.state()["components"].get(component, {})
        return [(float(a), float(b)) for a, b in spec.get("history", [])]

    def wait_ready(self, component: str, proc: subprocess.Popen[bytes] | None = None,
                   timeout_s: float = 120.0) -> None:
        spec = self.state()["components"][component]
        ready = spec.get("ready")
        end = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < end:
            if proc is not None and proc.poll() is not None:
                raise StackError(f"{component} exited with {proc.returncode} before it was "
                                 f"ready; log:\n{self.log_tail(component)}")
            if ready is None:
                return
            try:
                ctx = self._client_context(ready.get("client_cert", False))
                with urllib.request.urlopen(ready["url"], timeout=2, context=ctx) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError, ssl.SSLError) as e:
                last = str(e)
            time.sleep(0.2)
        raise StackError(f"{component} not ready within {timeout_s:.0f}s ({ready}): {last}; "
                         f"log:\n{self.log_tail(component)}")

    def _client_context(self, client_cert: bool) -> ssl.SSLContext:
        pki = self.dir / "pki"
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.check_hostname = False
        if client_cert:
            ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        else:
            # kube-scheduler serves a self-signed certificate of its own making.
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def stop(self, component: str, sig: int = signal.SIGTERM, timeout_s: float | None = None
             ) -> None:
        """Stop exactly the process group started for ``component`` (no-op if gone):
        ``sig``, then SIGKILL after the component's grace period."""
        pid = self.pid(component)
        if pid is None:
            return
        if timeout_s is None:
            timeout_s = float(self.state()["components"][component].get("grace_s", 15.0))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        end = time.monotonic() + timeout_s

        def running() -> bool:
            # The whole group: a "restart: always" component's leader is its bash
            # supervise loop, which dies at once while the component drains (a webhook
            # still answering reviews on kept-alive connections after stop returned).
            return self.alive(component) or group_alive(pid)

        while running() and time.monotonic() < end:
            time.sleep(0.05)
        if running():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            while running() and time.monotonic() < end + 5:
                time.sleep(0.05)
        self.pid_file(component).unlink(missing_ok=True)

    def kill(self, component: str) -> None:
        self.stop(component, signal.SIGKILL)

    def restart(self, component: str) -> None:
        self.stop(component)
        self.start(component)

    def down(self) -> None:
        for component in reversed(list(self.state()["components"])):
            self.stop(component)

    def log_tail(self, component: str, lines: int = 40) -> str:
        try:
            text = self.log_file(component).read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def logs(self) -> Iterator[tuple[str, str]]:
        for component in self.state()["components"]:
            with contextlib.suppress(OSError):
                yield component, self.log_file(component).read_text(errors="replace")


# -- bring-up -----------------------------------------------------------------------------------


def _api(kubeconfig: Path) -> Any:
    from kubernetes import config

    return config.new_client_from_config(config_file=str(kubeconfig))


def apply_objects(api_client: Any, objs: Sequence[Mapping[str, Any]]) -> None:
    from kubernetes import utils
    from kubernetes.client.rest import ApiException

    for obj in objs:
        try:
            utils.create_from_dict(api_client, dict(obj))
        except utils.FailToCreateError as e:
            # Already there (a restart of the bootstrap) is fine; anything else is not.
            for exc in e.api_exceptions:
                if not (isinstance(exc, ApiException) and exc.status == 409):
                    raise StackError(f"creating {obj['kind']} {obj['metadata']['name']}: "
                                     f"{exc}") from None


def ensure_namespace(api_client: Any, name: str, labels: Mapping[str, str] | None = None
                     ) -> None:
    """A namespace and its ``default`` ServiceAccount (no controller-manager makes it)."""
    apply_objects(api_client, [
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": name, "labels": dict(labels or {})}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "default", "namespace": name}},
    ])


def service_account_token(api_client: Any, namespace: str, name: str,
                          pod: tuple[str, str] | None = None) -> str:
    """A token of ServiceAccount ``name`` from the TokenRequest API; with ``pod`` (name,
    uid) bound to that pod, so that it also names the pod's node."""
    from kubernetes import client

    ref = None if pod is None else client.V1BoundObjectReference(
        api_version="v1", kind="Pod", name=pod[0], uid=pod[1])
    body = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=48 * 3600,
                                       bound_object_ref=ref))
    core: Any = client.CoreV1Api(api_client)
    out = core.create_namespaced_service_account_token(
        name, namespace, body)
    return str(out.status.token)


@contextlib.contextmanager
def metrics_reader(api_client: Any, account: str, role: str) -> Iterator[str]:
    """A token of ServiceAccount ``account`` (in gpupack's namespace) whose ClusterRole
    ``role`` allows GET /metrics, as Prometheus is granted it; all three removed after."""
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(api_client)
    core = client.CoreV1Api(api_client)
    apply_objects(api_client, [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": account, "namespace": NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": role},
         "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": role},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": role},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]},
    ])
    try:
        yield service_account_token(api_client, NAMESPACE, account)
    finally:
        with contextlib.suppress(client.ApiException):
            rbac.delete_cluster_role_binding(role)
        with contextlib.suppress(client.ApiException):
            rbac.delete_cluster_role(role)
        with contextlib.suppress(client.ApiException):
            core.delete_namespaced_service_account(account, NAMESPACE)


def _gpupack(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpupack", *args]


# gpupack's processes run the code of the tree these tests come from (also when another
# checkout is pip-installed in editable mode).
GPUPACK_ENV = {"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


def up(dir_: Path, *, extender_args: Sequence[str] = (), plain: bool = True,
       agent: bool = True, standby: bool = True,
       profile_overrides: Mapping[str, Any] | None = None,
       feature_gates: Sequence[str] = (), runtime_config: Sequence[str] = ()) -> Stack:
    """Start everything and wait until every component is ready. When any step fails
    (a component not ready in time, an object the API refuses, an interrupt), every
    component already started is stopped before the error goes on: a failed start leaves
    no process behind. ``feature_gates`` ("Name=true") go to kube-apiserver, every
    kube-scheduler and kube-controller-manager; ``runtime_config`` ("group/version=true")
    to kube-apiserver."""
    dir_ = dir_.resolve()
    stack = Stack(dir_)
    if stack.state_file.exists() and any(stack.alive(c) for c in stack.state()["components"]):
        raise StackError(f"{dir_} already holds a running stack: run down first")
    try:
        return _up(stack, extender_args=extender_args, plain=plain, agent=agent,
                   standby=standby, profile_overrides=profile_overrides,
                   gates=[f"--feature-gates={','.join(feature_gates)}"] if feature_gates else [],
                   runtime=([f"--runtime-config={','.join(runtime_config)}"]
                            if runtime_config else []))
    except BaseException:
        if stack.state_file.exists():
            with contextlib.suppress(Exception):
                stack.down()
        raise


def _up(stack: Stack, *, extender_args: Sequence[str], plain: bool, agent: bool,
        standby: bool, profile_overrides: Mapping[str, Any] | None,
        gates: Sequence[str] = (), runtime: Sequence[str] = ()) -> Stack:
    dir_ = stack.dir
    for sub in ("pids", "logs", "pki", "kubeconfigs", "config"):
        (dir_ / sub).mkdir(parents=True, exist_ok=True)
    bins = build_binaries()
    pki = dir_ / "pki"
    make_pki(pki)
    ports = {name: free_port() for name in ("etcd", "etcd_peer", "apiserver", "webhook",
                                            "plain_scheduler")}
    server = f"https://127.0.0.1:{ports['apiserver']}"
    write_kubeconfig(stack.kubeconfig, server, pki / "ca.crt", cert=pki / "admin.crt",
                     key=pki / "admin.key")
    components: dict[str, dict[str, Any]] = {}
    state: dict[str, Any] = {"ports": ports, "server": server, "bin": str(bins),
                             "components": components, "namespace": NAMESPACE}
    audit_policy = dir_ / "config" / "audit-policy.yaml"
    audit_policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    etcd_url = f"http://127.0.0.1:{ports['etcd']}"
    peer_url = f"http://127.0.0.1:{ports['etcd_peer']}"
    components["etcd"] = {
        "argv": [str(bins / "etcd"), "--name", "e2e", "--data-dir", str(dir_ / "etcd"),
                 "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                 "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                 "--initial-cluster", f"e2e={peer_url}", "--log-level", "warn",
                 # Test data only: fsync would make every write wait for the disk.
                 "--unsafe-no-fsync"],
        "ready": {"url": f"{etcd_url}/health"}}
    components["apiserver"] = {
        "argv": [str(bins / "kube-apiserver"),
                 f"--etcd-servers={etcd_url}", "--bind-address=127.0.0.1",
                 "--advertise-address=127.0.0.1", f"--secure-port={ports['apiserver']}",
                 f"--tls-cert-file={pki / 'apiserver.crt'}",
                 f"--tls-private-key-file={pki / 'apiserver.key'}",
                 f"--client-ca-file={pki / 'ca.crt'}",
                 # The front-proxy CA that kube-scheduler's delegated authentication
                 # reads from kube-system/extension-apiserver-authentication.
                 f"--requestheader-client-ca-file={pki / 'ca.crt'}",
                 "--requestheader-allowed-names=front-proxy-client",
                 "--requestheader-username-headers=X-Remote-User",
                 "--requestheader-group-headers=X-Remote-Group",
                 "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                 "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                 f"--service-account-key-file={pki / 'sa.pub'}",
                 f"--service-account-signing-key-file={pki / 'sa.key'}",
                 "--service-cluster-ip-range=10.96.0.0/16",
                 "--authorization-mode=Node,RBAC",
                 # The default admission plugins (MutatingAdmissionWebhook among them),
                 # plus NodeRestriction as a real cluster has.
                 "--enable-admission-plugins=NodeRestriction",
                 # Its client certificate for the webhook, which acts on nothing else.
                 f"--admission-control-config-file={admission_config(dir_, ports['webhook'])}",
                 # No Service network: the "kubernetes" Service's endpoints would be a
                 # loopback address, which the API refuses.
                 "--endpoint-reconciler-type=none",
                 f"--cert-dir={pki / 'apiserver-generated'}", "--profiling=false",
                 # Every request of gpupack's ServiceAccounts, for the RBAC tests: what
                 # each one did, and whether anything was refused.
                 f"--audit-policy-file={audit_policy}",
                 f"--audit-log-path={dir_ / 'logs' / 'audit.log'}",
                 "--audit-log-format=json", "--audit-log-maxsize=0",
                 *gates, *runtime, "--v=1"],
        "ready": {"url": f"{server}/readyz", "client_cert": True},
        # It stops listening at once on SIGTERM but lingers in shutdown for long; all
        # its state is in etcd, so a short grace keeps "restart" an outage of seconds.
        "grace_s": 3}
    stack.save(state)
    stack.start("etcd")
    stack.start("apiserver")
    # start() recorded each start's times in the saved state: carry on from it.
    state = stack.state()
    components = state["components"]

    admin = _api(stack.kubeconfig)
    # TLS for the webhook from the project's own script; the API server calls it by URL.
    tls_dir = dir_ / "webhook-tls"
    run(["bash", str(REPO / "manifests" / "tls" / "make-self-signed.sh"), str(tls_dir),
         NAMESPACE, f"{RELEASE}-webhook", "7"], env={**os.environ, "EXTRA_SANS": "IP:127.0.0.1"})
    ca_b64 = base64.b64encode((tls_dir / "ca.crt").read_bytes()).decode()
    client_ca_b64 = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
    objs = render_chart(ca_b64, (*CHART_VALUES, "--set", "webhook.clientAuth.enabled=true",
                                 "--set", f"webhook.clientAuth.caBundle={client_ca_b64}",
                                 "--set", f"webhook.clientAuth.names[0]={WEBHOOK_CLIENT}"))
    applied = [o for o in objs if o.get("kind") in APPLIED_KINDS
               and o.get("kind") != "MutatingWebhookConfiguration"]
    apply_objects(admin, sorted(applied, key=lambda o: o["kind"] != "Namespace"))
    ensure_namespace(admin, NAMESPACE)
    accounts = service_accounts(objs)
    if agent:
        create_agent_node(admin)
    # kube-controller-manager as a kubeadm cluster runs it (below); first only its
    # token controller, which fills in the chart's service-account-token Secrets (the
    # extender's token) as on a cluster.
    kcm_kc = dir_ / "kubeconfigs" / "controller-manager"
    write_kubeconfig(kcm_kc, server, pki / "ca.crt", cert=pki / "controller-manager.crt",
                     key=pki / "controller-manager.key")
    secret_tokens = filled_token_secrets(stack, state, bins, kcm_kc, token_secrets(objs))
    kubeconfigs: dict[str, Path] = {}
    for component, account in accounts.items():
        path = dir_ / "kubeconfigs" / component
        # The agent's token is bound to a pod on its node, as the kubelet's projected
        # token of a DaemonSet pod is: it names the node, which the chart's
        # ValidatingAdmissionPolicy checks. The extender's is its token Secret's.
        bound = agent_pod(admin, account) if component == "node-agent" and agent else None
        namespace = AGENT_NAMESPACE if component == "node-agent" else NAMESPACE
        token = secret_tokens.get(account) or service_account_token(admin, namespace,
                                                                    account, bound)
        write_kubeconfig(path, server, pki / "ca.crt", token=token)
        kubeconfigs[component] = path
    state["service_accounts"] = accounts
    plain_kc = dir_ / "kubeconfigs" / "plain-scheduler"
    write_kubeconfig(plain_kc, server, pki / "ca.crt", cert=pki / "plain-scheduler.crt",
                     key=pki / "plain-scheduler.key")

    webhook_url = f"https://127.0.0.1:{ports['webhook']}"
    components["webhook"] = {
        "argv": chart_command(objs, "webhook", {
            "--in-cluster": None, "--kubeconfig": str(kubeconfigs["webhook"]),
            "--host": "127.0.0.1", "--port": str(ports["webhook"]),
            "--tls-cert": str(tls_dir / "tls.crt"), "--tls-key": str(tls_dir / "tls.key"),
            "--client-ca": str(pki / "ca.crt")}),
        "cwd": str(dir_), "env": GPUPACK_ENV,
        "ready": {"url": f"{webhook_url}/healthz"}, "restart": "always"}
    # The chart's scheduler Deployment runs 2 replicas, each kube-scheduler with its
    # extender sidecar; replica "b" is the standby, told apart by its host name (each
    # replica is a pod with a host name of its own: kube-scheduler's lease identity is
    # <hostname>_<uuid>, and the extender follows the lease by that host name).
    replicas = ("", "-b") if standby and os.geteuid() == 0 and shutil.which("unshare") else ("",)
    state["replicas"] = list(replicas)
    for suffix in replicas:
        components.update(scheduler_pair(objs, bins, dir_, kubeconfigs, ports, suffix,
                                         (*E2E_EXTENDER_ARGS, *extender_args),
                                         profile_overrides or {}, gates))
    if plain:
        plain_cfg = dir_ / "config" / "plain-scheduler-config.yaml"
        plain_cfg.write_text(yaml.safe_dump(plain_scheduler_config(plain_kc)))
        components["plain-scheduler"] = {
            "argv": [str(bins / "kube-scheduler"), f"--config={plain_cfg}",
                     "--bind-address=127.0.0.1", f"--secure-port={ports['plain_scheduler']}",
                     f"--cert-dir={dir_ / 'plain-scheduler-certs'}",
                     f"--authentication-kubeconfig={plain_kc}",
                     f"--authorization-kubeconfig={plain_kc}", *gates, "--v=1"],
            "ready": {"url": f"https://127.0.0.1:{ports['plain_scheduler']}/healthz"},
            "restart": "always"}
    # kube-controller-manager as a kubeadm cluster runs it: its own identity
    # (system:kube-controller-manager) and each controller with its ServiceAccount's
    # token (system:controller:*, the built-in roles), nothing but CONTROLLERS.
    def controller_manager(name: str, controllers: Sequence[str]) -> dict[str, Any]:
        port = free_port()
        return {
            "argv": [str(bins / "kube-controller-manager"), f"--kubeconfig={kcm_kc}",
                     f"--authentication-kubeconfig={kcm_kc}",
                     f"--authorization-kubeconfig={kcm_kc}",
                     "--bind-address=127.0.0.1", f"--secure-port={port}",
                     f"--cert-dir={dir_ / f'{name}-certs'}", "--leader-elect=false",
                     "--use-service-account-credentials=true",
                     f"--controllers={','.join(controllers)}", *gates, "--v=1"],
            "ready": {"url": f"https://127.0.0.1:{port}/healthz"}}

    components["controller-manager"] = controller_manager("controller-manager", CONTROLLERS)
    components["claim-controller"] = controller_manager("claim-controller", DRA_CONTROLLERS)
    if agent:
        components["node-agent"] = {
            "argv": [sys.executable, str(HERE / "agent_double.py"), "--socket-dir",
                     str(dir_ / "kubelet"), "--",
                     "--node-name", AGENT_NODE, "--kubeconfig", str(kubeconfigs["node-agent"]),
                     "--interval", "1", "--min-patch-interval", "1", "--metrics-port", "0"],
            "cwd": str(dir_), "env": GPUPACK_ENV}
    components["mig-manager"] = {
        "argv": [sys.executable, str(HERE / "mig_manager_double.py"), "--kubeconfig",
                 str(stack.kubeconfig), "--namespace", NAMESPACE, "--config-map",
                 MIG_CONFIG_MAP, "--delay", "1.0", "--file-lag", str(E2E_MIG_FILE_LAG_S)],
        "cwd": str(dir_), "env": GPUPACK_ENV}
    stack.save(state)
    stack.start("webhook")
    for suffix in replicas:
        stack.start(f"extender{suffix}")
    # Only once the webhook answers: register it (failurePolicy then means what it says).
    apply_objects(admin, [webhook_config_for_url(objs, webhook_url)])
    # Replica "a" first, so that it takes the lease and "b" starts as the standby.
    for component in ("scheduler", "scheduler-b", "plain-scheduler", "node-agent",
                      "mig-manager"):
        if component in components:
            stack.start(component)
    return stack


def filled_token_secrets(stack: Stack, state: dict[str, Any], bins: Path, kubeconfig: Path,
                         secrets: Mapping[str, str]) -> dict[str, str]:
    """account -> the token kube-controller-manager's token controller wrote into its
    Secret (``secrets``: account -> Secret name). The controller runs until every token
    is in, then stops."""
    from kubernetes import client

    if not secrets:
        return {}
    pki = stack.dir / "pki"
    port = free_port()
    state["components"]["token-controller"] = {
        "argv": [str(bins / "kube-controller-manager"), f"--kubeconfig={kubeconfig}",
                 f"--authentication-kubeconfig={kubeconfig}",
                 f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
                 f"--secure-port={port}", f"--cert-dir={stack.dir / 'token-controller-certs'}",
                 "--leader-elect=false", "--controllers=serviceaccount-token-controller",
                 f"--service-account-private-key-file={pki / 'sa.key'}",
                 f"--root-ca-file={pki / 'ca.crt'}", "--v=1"],
        "ready": {"url": f"https://127.0.0.1:{port}/healthz"}}
    stack.save(state)
    stack.start("token-controller")
    # start() recorded its times in the saved state: keep them (in the same dict).
    state["components"]["token-controller"] = stack.state()["components"]["token-controller"]
    core: Any = client.CoreV1Api(_api(stack.kubeconfig))
    out: dict[str, str] = {}
    end = time.monotonic() + 60
    try:
        while len(out) < len(secrets):
            if time.monotonic() > end:
                raise StackError(f"the token controller filled no token into "
                                 f"{sorted(set(secrets.values()))} within 60 s; log:\n"
                                 f"{stack.log_tail('token-controller')}")
            for account, name in secrets.items():
                data = core.read_namespaced_secret(name, NAMESPACE).data or {}
                if "token" in data:
                    out[account] = base64.b64decode(data["token"]).decode()
            time.sleep(0.2)
    finally:
        stack.stop("token-controller")
    return out


@contextlib.contextmanager
def controllers(stack: Stack) -> Iterator[None]:
    """kube-controller-manager (CONTROLLERS only) runs inside the block."""
    with _running(stack, "controller-manager"):
        yield


@contextlib.contextmanager
def claim_controller(stack: Stack) -> Iterator[None]:
    """kube-controller-manager's resourceclaim controller (DRA_CONTROLLERS) runs inside
    the block."""
    with _running(stack, "claim-controller"):
        yield


@contextlib.contextmanager
def _running(stack: Stack, component: str) -> Iterator[None]:
    if component not in stack.state()["components"]:
        raise StackError(f"this stack predates the {component} component: bring it up again")
    if not stack.alive(component):
        stack.start(component)
    try:
        yield
    finally:
        stack.stop(component)


STANDBY_HOSTNAME = "gpupack-scheduler-b"


def scheduler_pair(objs: Sequence[Mapping[str, Any]], bins: Path, dir_: Path,
                   kubeconfigs: Mapping[str, Path], ports: Mapping[str, int], suffix: str,
                   extender_args: Sequence[str], profile_overrides: Mapping[str, Any],
                   gates: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    """kube-scheduler and its extender sidecar, as one replica of the chart's scheduler
    Deployment. ``suffix`` "" is the host's replica; "-b" runs under a host name of its
    own (a UTS namespace: root only)."""
    ext_port, metrics_port, sched_port = free_port(), free_port(), free_port()
    extender_url = f"http://127.0.0.1:{ext_port}"
    identity = [] if not suffix else ["--leader-identity", STANDBY_HOSTNAME]
    extender = {
        "argv": chart_command(objs, "extender", {
            "--in-cluster": None, "--kubeconfig": str(kubeconfigs["extender"]),
            "--host": "127.0.0.1", "--port": str(ext_port),
            "--metrics-host": "127.0.0.1", "--metrics-port": str(metrics_port)},
        ) + identity + list(extender_args),
        "cwd": str(dir_), "env": GPUPACK_ENV, "url": extender_url,
        "ready": {"url": f"{extender_url}/healthz"}, "restart": "always"}
    sched_cfg = dir_ / "config" / f"scheduler{suffix}-config.yaml"
    config = scheduler_config(objs, ext_port, kubeconfigs["scheduler"])
    for profile in config["profiles"]:
        profile.update(profile_overrides)  # benchmarks only: the tests run the chart's
    sched_cfg.write_text(yaml.safe_dump(config))
    argv = [str(bins / "kube-scheduler"), f"--config={sched_cfg}",
            "--bind-address=127.0.0.1", f"--secure-port={sched_port}",
            f"--cert-dir={dir_ / f'scheduler{suffix}-certs'}",
            f"--authentication-kubeconfig={kubeconfigs['scheduler']}",
            f"--authorization-kubeconfig={kubeconfigs['scheduler']}", *gates, "--v=2"]
    if suffix:
        argv = ["unshare", "--uts", "sh", "-c", f'hostname {STANDBY_HOSTNAME} && exec "$@"',
                "kube-scheduler", *argv]
    scheduler = {"argv": argv, "restart": "always",
                 "ready": {"url": f"https://127.0.0.1:{sched_port}/healthz"}}
    return {f"extender{suffix}": extender, f"scheduler{suffix}": scheduler}


def active_replica(stack: Stack, api_client: Any) -> str:
    """"" or "-b": the replica whose kube-scheduler holds the chart's scheduler Lease."""
    from kubernetes import client

    coordination: Any = client.CoordinationV1Api(api_client)
    lease = coordination.read_namespaced_lease(
        f"{RELEASE}-scheduler", NAMESPACE)
    holder = (lease.spec.holder_identity or "").rsplit("_", 1)[0]
    return "-b" if holder == STANDBY_HOSTNAME else ""


def agent_pod(admin: Any, account: str) -> tuple[str, str]:
    """The node agent's DaemonSet pod on the agent's node (bound there directly, never
    run): (name, uid)."""
    from kubernetes import client

    core: Any = client.CoreV1Api(admin)
    name = f"{RELEASE}-node-agent-e2e"
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": AGENT_NAMESPACE},
            "spec": {"nodeName": AGENT_NODE, "serviceAccountName": account,
                     "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "agent", "image": "registry.example/gpupack:e2e"}]}}
    try:
        made = core.create_namespaced_pod(AGENT_NAMESPACE, body)
    except client.ApiException as e:
        if e.status != 409:
            raise
        made = core.read_namespaced_pod(name, AGENT_NAMESPACE)
    return name, str(made.metadata.uid)


def create_agent_node(admin: Any) -> None:
    """The Node the agent double reports: the recorded fake's GPUs (an H100 with MIG, a
    time-sliced L40S), tainted so that no test workload lands on it."""
    from kubernetes import client

    core: Any = client.CoreV1Api(admin)
    body = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": AGENT_NODE, "labels": {
                "kubernetes.io/hostname": AGENT_NODE,
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "2",
                # Its GPUs stay as they are: no slice may be promised on them.
                "gpupack.io/mig-reconfigure": "false"}},
            "spec": {"taints": [{"key": "gpupack.io/e2e-agent-only", "effect": "NoSchedule"}]}}
    with contextlib.suppress(client.ApiException):
        core.create_node(body)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="control-plane.sh",
                                description="the real control plane on loopback for gpupack")
    sub = p.add_subparsers(dest="verb", required=True)
    u = sub.add_parser("up", help="start everything into DIR")
    u.add_argument("dir", type=Path)
    u.add_argument("--no-plain", action="store_true", help="no plain kube-scheduler")
    u.add_argument("--no-agent", action="store_true", help="no node agent")
    u.add_argument("--no-standby", action="store_true",
                   help="one kube-scheduler + extender replica (default: two)")
    u.add_argument("--extender-arg", action="append", default=[],
                   help="extra argument for gpupack serve (repeatable)")
    d = sub.add_parser("down", help="stop what up started in DIR")
    d.add_argument("dir", type=Path)
    for verb in ("restart", "kill", "start", "stop"):
        s = sub.add_parser(verb, help=f"{verb} one component")
        s.add_argument("dir", type=Path)
        s.add_argument("component", choices=COMPONENTS)
    args = p.parse_args(argv)
    try:
        if args.verb == "up":
            try:
                stack = up(args.dir, extender_args=args.extender_arg, plain=not args.no_plain,
                           agent=not args.no_agent, standby=not args.no_standby)
            except BaseException:
                # Leave nothing running behind a failed start.
                if Stack(args.dir.resolve()).state_file.exists():
                    Stack(args.dir.resolve()).down()
                raise
            print(f"up: kubeconfig {stack.kubeconfig}")
            return 0
        stack = Stack(args.dir.resolve())
        if not stack.state_file.exists():
            print(f"control-plane.sh: {args.dir}: no stack here (no state.json)", file=sys.stderr)
            return 2
        if args.verb == "down":
            stack.down()
        else:
            getattr(stack, args.verb)(args.component)
        return 0
    except StackError as e:
        print(f"control-plane.sh: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())


def _metric_families(port: int, token: str, context: Any = None) -> dict[str, Any] | None:
    """The metric families by name that ``127.0.0.1:port`` serves at /metrics (HTTPS
    with ``context``), or None while it refuses the token (RBAC lag)."""
    import http.client

    from prometheus_client.parser import text_string_to_metric_families

    conn = (http.client.HTTPSConnection("127.0.0.1", port, timeout=15, context=context)
            if context is not None else http.client.HTTPConnection("127.0.0.1", port,
                                                                   timeout=15))
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        body = resp.read().decode()
    finally:
        conn.close()
    if resp.status != 200:
        return None
    return {f.name: f for f in text_string_to_metric_families(body)}


def extender_metrics(stack: Stack, api_client: Any, token: str) -> dict[str, Any] | None:
    """The active extender's metric families by name, or None while it refuses the token
    (RBAC lag)."""
    argv = stack.state()["components"][f"extender{active_replica(stack, api_client)}"]["argv"]
    return _metric_families(int(argv[argv.index("--metrics-port") + 1]), token)


def webhook_metrics(stack: Stack, token: str) -> dict[str, Any] | None:
    """The webhook's metric families by name (its HTTPS /metrics), or None while it
    refuses the token."""
    import ssl

    argv = stack.state()["components"]["webhook"]["argv"]
    ctx = ssl.create_default_context(cafile=str(stack.dir / "webhook-tls" / "ca.crt"))
    ctx.check_hostname = False  # the certificate names the Service; we call 127.0.0.1
    return _metric_families(int(argv[argv.index("--port") + 1]), token, ctx)


def metric_sample(fams: Mapping[str, Any], name: str, **labels: str) -> float | None:
    """The value of the first sample of ``name`` (or ``name_total``) with ``labels``."""
    fam = fams.get(name)
    for s in fam.samples if fam is not None else ():
        if s.name in (name, name + "_total") and all(s.labels.get(k) == v
                                                     for k, v in labels.items()):
            return float(s.value)
    return None
