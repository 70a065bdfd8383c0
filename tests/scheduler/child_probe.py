"""A child target for tests/scheduler/test_child_memory.py: answers which of the module
names it is sent are imported in the child."""

from __future__ import annotations

import sys
from multiprocessing.connection import Connection

from scheduler.child import serve_messages


def report_modules(conn: Connection) -> None:
    serve_messages(conn, lambda names: [n for n in names if n in sys.modules])
