"""Answers the ``kubernetes`` client returns with ``_preload_content=False``.

Such an answer is urllib3's raw response: its connection goes back to the client's pool
only once the body is read to the end (or the connection is released). Calls that only
need the status (a Binding, an Eviction, an Event) must still finish the answer, or
each leaves its connection checked out until the garbage collector finds it, and the
next call opens a new TCP and TLS connection to the API server.
"""

from __future__ import annotations

import contextlib
from typing import Any


def finish(resp: Any) -> None:
    """Read the rest of ``resp`` and hand its connection back to the pool; whatever goes
    wrong doing so only costs that connection (the answer's status is already known)."""
    with contextlib.suppress(Exception):
        read = getattr(resp, "read", None)
        if read is not None:
            read()
    with contextlib.suppress(Exception):
        release = getattr(resp, "release_conn", None)
        if release is not None:
            release()
