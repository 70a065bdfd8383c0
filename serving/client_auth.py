"""Who may post AdmissionReviews: the API server's client certificate.

kube-apiserver presents a client certificate to a webhook when its admission
configuration names one for the webhook's host (``--admission-control-config-file``:
a ``WebhookAdmissionConfiguration`` whose ``kubeConfigFile`` has a user named after the
webhook, ``<service>.<namespace>.svc`` or ``host:port`` for a URL; docs/install.md).
Then only a caller holding a certificate from that CA, with an allowed name, may have
its reviews acted on; anyone else on the pod network is answered 401 (no certificate)
or 403 (another name), before the body is read.

The TLS listener asks for a certificate without requiring one (``CERT_OPTIONAL``): the
kubelet's probes and Prometheus' scrapes reach ``/healthz``, ``/readyz`` and
``/metrics`` of the same port without one. A certificate that is presented is verified
in the handshake (a forged or expired one fails it); which paths need one is the app's
decision (:func:`refusal`). The verified certificate reaches the app in the WSGI
environ under :data:`PEER_CERT` (``ssl.SSLSocket.getpeercert()``: None when the client
sent none).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The WSGI environ key of the verified client certificate (getpeercert()'s dict).
PEER_CERT = "gpupack.peer_cert"


@dataclass(frozen=True)
class ClientAuth:
    """Client certificates signed by ``ca`` are verified in the handshake; one whose
    subject CN or a DNS/URI subject alternative name is in ``names`` is the API server
    (an empty ``names``: any certificate of that CA)."""

    ca: Path
    names: frozenset[str] = frozenset()

    def configure(self, ctx: ssl.SSLContext) -> None:
        """Ask for (but do not require) a client certificate, verified against ``ca``."""
        ctx.load_verify_locations(cafile=str(self.ca))
        ctx.verify_mode = ssl.CERT_OPTIONAL

    def refusal(self, peer: Mapping[str, Any] | None) -> tuple[int, str] | None:
        """(HTTP status, why) when ``peer`` may not post reviews, else None."""
        if not peer:
            return 401, ("gpupack webhook: a client certificate is required to post "
                         "AdmissionReviews (only the API server may)")
        names = identities(peer)
        if self.names and not names & self.names:
            shown = ", ".join(sorted(names)) or "none"
            return 403, (f"gpupack webhook: client certificate names {shown}; only "
                         f"{', '.join(sorted(self.names))} may post AdmissionReviews")
        return None


def identities(peer: Mapping[str, Any]) -> frozenset[str]:
    """The subject common names and DNS/URI subject alternative names of a certificate
    as ``getpeercert()`` gives it."""
    out: set[str] = set()
    for rdn in peer.get("subject", ()) or ():
        for pair in rdn:
            if isinstance(pair, Sequence) and len(pair) == 2 and pair[0] == "commonName":
                out.add(str(pair[1]))
    for kind, value in peer.get("subjectAltName", ()) or ():
        if kind in ("DNS", "URI"):
            out.add(str(value))
    return frozenset(out)


def peer_certificate(sock: Any) -> dict[str, Any] | None:
    """The client certificate a TLS socket verified (None: plain, or none sent)."""
    get = getattr(sock, "getpeercert", None)
    if get is None:
        return None
    try:
        cert = get()
    except (OSError, ValueError):
        return None
    return dict(cert) if cert else None


def check_client_ca(ca: Path) -> str | None:
    """Why ``ca`` cannot verify client certificates, or None (checked at start)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_verify_locations(cafile=str(ca))
    except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
        return f"{ca}: {e}"
    return None
