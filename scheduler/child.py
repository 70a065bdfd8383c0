"""A long-lived worker child process, and the loop it runs: what the solver
(:mod:`scheduler.planner.solve`) and the memo warmer (:mod:`scheduler.memo.loop`) have in common.

Both keep CPU-bound Python out of the process that answers kube-scheduler, whose
request threads would otherwise wait for the GIL. The parent side,
:class:`ChildProcess`: one daemon child (``spawn`` by default: a fresh interpreter,
nothing of the request process's threads or locks inherited) started on first use, sent
one message at a time, its answer awaited with a timeout, and stopped when it dies,
breaks the pipe or gives no answer in time (the next call starts a fresh one). The child
side, :func:`serve_messages`: puts itself on idle CPU time (:func:`background`) and
answers each message with ``("ok", value)`` or ``("error", text)`` until the parent is
gone. What the messages are is each user's own protocol.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import multiprocessing as mp
import os
import pickle
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

NICE = 10


def background() -> None:
    """Make the calling process use only idle CPU time (SCHED_IDLE, else nice)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(OSError):
            os.nice(NICE)


def give_back_memory() -> None:
    """Return the C heap's free pages to the system (glibc ``malloc_trim``; nothing
    elsewhere). A solve's OR-Tools model and search and its snapshot's larger Python
    objects leave ~50 MiB (1,000 nodes) of freed memory in the process otherwise, which
    counts in its RSS and PSS until the next solve reuses it."""
    global _TRIM
    if _TRIM is None:
        try:
            _TRIM = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _TRIM = False
    if _TRIM:
        _TRIM(0)


_TRIM: Any = None
# A message this small is sent on the caller's thread: it fits the empty pipe's buffer
# (64 KiB for a pipe, more for the socket pair a duplex Pipe is), so it cannot block.
DIRECT_SEND_BYTES = 32 * 1024


def serve_messages(conn: Connection, handle: Callable[[Any], Any],
                   trim: bool = False) -> None:
    """The child's loop: each message in, ``("ok", handle(message))`` or ``("error",
    "Type: text")`` out, until the pipe closes (the parent is gone). ``trim``: give
    freed memory back (:func:`give_back_memory`) after each answer, for children whose
    messages are few and large (the solver)."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply: tuple[str, Any] = ("ok", handle(msg))
        except Exception as e:  # reported to the parent, which logs and keeps going
            reply = ("error", f"{type(e).__name__}: {e}")
        try:
            conn.send(reply)
        except (EOFError, OSError):
            return
        if trim:
            del msg, reply
            gc.collect()
            give_back_memory()


_MAIN_LOCK = threading.Lock()


@contextlib.contextmanager
def _bare_main() -> Iterator[None]:
    """While a child is spawned, ``__main__`` is an empty module. ``spawn`` has a child
    import the parent's main script first (as ``__mp_main__``): for ``gpupack serve``
    run as a console script (or a benchmark's script) that is the whole CLI, every
    subcommand and OR-Tools, numpy and pandas with it (~100 MiB a child). The targets
    are functions of importable modules and need nothing of the main script."""
    with _MAIN_LOCK:
        real = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            sys.modules["__main__"] = real


def start_child(ctx: Any, target: Callable[[Connection], None], name: str,
                error: type[Exception]) -> tuple[Any, Connection]:
    """Start ``target(conn)`` in a daemon child; the process and the parent's end of the
    pipe. A child that fails to start raises ``error`` and leaves nothing to close: a
    caller keeps the process only once it runs (terminate() on one that never ran
    raises and hides the cause)."""
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child,), daemon=True, name=name)
    try:
        with _bare_main():
            proc.start()
    except Exception as e:
        parent.close()
        raise error(f"{name} did not start: {e}") from None
    finally:
        child.close()
    return proc, parent


class ChildGone(Exception):
    """The pipe to the child broke (it died); the child is stopped."""


class ChildTimeout(Exception):
    """The child gave no answer in time; it is stopped."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"no answer in {timeout_s:.0f} s")
        self.timeout_s = timeout_s


class ChildProcess:
    """One long-lived child running ``target(conn)``, started on first use and again
    after it died or was stopped. ``error``: raised when it cannot start, and with the
    text of an ``("error", text)`` answer."""

    def __init__(self, target: Callable[[Connection], None], name: str, *,
                 start_method: str = "spawn", error: type[Exception] = RuntimeError) -> None:
        self._ctx: Any = mp.get_context(start_method)
        self._target = target
        self._name = name
        self._error = error
        self._proc: Any = None
        self._conn: Connection | None = None
        self.starts = 0
        self._shut = False  # shutdown(): no child is started any more

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else int(self._proc.pid)

    def running(self) -> bool:
        return self._proc is not None and self._proc.is_alive() and self._conn is not None

    def started(self) -> None:
        """Called after each start of a child (for state tied to one child)."""

    def ensure(self) -> Connection:
        """The pipe to a running child, starting one when there is none (``error``
        after :meth:`shutdown`)."""
        if self.running():
            assert self._conn is not None
            return self._conn
        self.close()
        if self._shut:
            raise self._error(f"{self._name} is shut down")
        self._proc, self._conn = start_child(self._ctx, self._target, self._name,
                                             self._error)
        self.starts += 1
        self.started()
        return self._conn

    def exchange(self, msg: Any, timeout_s: float) -> Any:
        """Send ``msg`` and return the child's answer as it is; the child is stopped
        (and :class:`ChildTimeout` or :class:`ChildGone` raised) when sending and
        answering take longer than ``timeout_s`` together or the pipe breaks."""
        conn = self.ensure()
        deadline = time.monotonic() + timeout_s
        try:
            sent = self._send(conn, msg, timeout_s)
            answered = sent and conn.poll(max(0.0, deadline - time.monotonic()))
            reply = conn.recv() if answered else None
        except (EOFError, OSError) as e:  # BrokenPipeError included
            self.close()
            raise ChildGone(str(e)) from None
        if not answered:
            self.close()
            raise ChildTimeout(timeout_s)
        return reply

    def _send(self, conn: Connection, msg: Any, timeout_s: float) -> bool:
        """Send ``msg``; False when it is not through in ``timeout_s``. The pipe's buffer
        is finite (64 KiB or more): a larger message blocks until the child reads it, for
        ever if the child is alive but never reads (stuck before its loop), and with it
        the planner or warmer thread that called. Such a message is sent from a helper
        thread; on time out the child is stopped first, which breaks the pipe under that
        thread (its write fails and it ends) before the parent's end is closed by
        :meth:`close`. A small one goes at once: the pipe is empty between exchanges,
        and a thread would cost ten times the exchange (bench: 40 against 300-600 us)."""
        data = bytes(ForkingPickler.dumps(msg))
        if len(data) <= DIRECT_SEND_BYTES:
            conn.send_bytes(data)
            return True
        failed: list[BaseException] = []

        def send() -> None:
            try:
                conn.send_bytes(data)
            except BaseException as e:  # handed to the caller's thread
                failed.append(e)

        t = threading.Thread(target=send, name=f"{self._name}-send", daemon=True)
        t.start()
        t.join(timeout_s)
        if t.is_alive():
            self._stop_process()
            t.join(5)
            return False
        if failed:
            raise failed[0]
        return True

    def request(self, msg: Any, timeout_s: float) -> Any:
        """:meth:`exchange` for a child run by :func:`serve_messages`: the value of an
        ``("ok", value)`` answer; ``error(text)`` for an ``("error", text)`` one."""
        kind, value = self.exchange(msg, timeout_s)
        if kind != "ok":
            raise self._error(str(value))
        return value

    def shutdown(self) -> None:
        """Stop the child for good: a call in flight fails, and no later call starts
        another (:meth:`close` lets the next call start a fresh one; an owner stopping
        while another thread may still be about to call must not let that thread
        start a child nobody stops)."""
        self._shut = True
        self.close()

    def close(self) -> None:
        """Stop the child (terminate, then kill if it is still there after 5 s), then
        close the parent's end: a send in flight on another thread fails on the broken
        pipe first, rather than writing to a descriptor closed under it."""
        conn = self._conn
        self._conn = None
        self._stop_process()
        if conn is not None:
            conn.close()

    def _stop_process(self) -> None:
        proc = self._proc
        self._proc = None
        if proc is not None:
            proc.terminate()
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(1)


# ---- what the messages carry -----------------------------------------------------------

CHUNK = 128  # items per pickle call: ~1-2 ms of GIL at most

def pickle_chunks(items: Sequence[Any]) -> tuple[bytes, ...]:
    """``items`` pickled CHUNK at a time (the GIL is free between chunks)."""
    return tuple(pickle.dumps(tuple(items[i:i + CHUNK]), protocol=pickle.HIGHEST_PROTOCOL)
                 for i in range(0, len(items), CHUNK))


def unpickle_chunks(chunks: Sequence[bytes]) -> tuple[Any, ...]:
    return tuple(x for b in chunks for x in pickle.loads(b))
