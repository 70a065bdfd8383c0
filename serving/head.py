"""The head of an HTTP/1.x request and where its body ends: pure functions over bytes.

The event loop (:mod:`serving.gate`) calls these on what it has buffered so far, to know
whether a whole request is in. They accept what RFC 9112 allows servers to accept (empty
lines before the request line, a chunked body with extensions and trailers) and refuse
what would make the body's end ambiguous (both Content-Length and chunked, two different
Content-Lengths, a transfer coding other than chunked): those are the requests that
smuggle a second request past a proxy.
"""

from __future__ import annotations

from dataclasses import dataclass

CRLF = b"\r\n"
END_OF_HEAD = b"\r\n\r\n"
_HEX = frozenset(b"0123456789abcdefABCDEF")
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


class HeadError(ValueError):
    """A request the server must refuse: ``status`` (400, 431, 501) and why."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


@dataclass(frozen=True)
class Head:
    method: str
    target: str  # as sent: origin-form path and query
    version: str  # "HTTP/1.1" or "HTTP/1.0"
    headers: tuple[tuple[str, str], ...]  # names lower-cased, in order
    content_length: int | None
    chunked: bool
    size: int  # bytes from the start of the buffer to the end of the head (empty lines too)

    @property
    def keep_alive(self) -> bool:
        conn = ",".join(v for k, v in self.headers if k == "connection").lower()
        tokens = {t.strip() for t in conn.split(",")}
        if self.version == "HTTP/1.0":
            return "keep-alive" in tokens
        return "close" not in tokens

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


def parse_head(buf: bytes, max_head: int) -> Head | None:
    """The head at the start of ``buf``; None while it is incomplete; HeadError when it
    cannot be served (over ``max_head`` bytes: 431, malformed: 400, an unsupported
    protocol: 505, an unsupported transfer coding: 501)."""
    start = 0
    while buf.startswith(CRLF, start):  # RFC 9112 2.2: ignore empty lines before it
        start += 2
    end = buf.find(END_OF_HEAD, start)
    if end < 0:
        if len(buf) - start > max_head:
            raise HeadError(431, f"request head over {max_head} bytes")
        return None
    if end - start > max_head:
        raise HeadError(431, f"request head over {max_head} bytes")
    lines = buf[start:end].split(CRLF)
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[0] or not set(parts[0]) <= _TOKEN:
        raise HeadError(400, "malformed request line")
    method, target, version = (p.decode("latin-1") for p in parts)
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HeadError(400 if not version.startswith("HTTP/") else 505,
                        f"unsupported protocol {version[:20]!r}")
    if not target or any(c in target for c in "\x00\r\n\t "):
        raise HeadError(400, "malformed request target")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or not set(name) <= _TOKEN:
            # A space before the colon, obsolete line folding or a line without a colon.
            raise HeadError(400, "malformed header line")
        headers.append((name.decode("latin-1").lower(), value.strip(b" \t").decode("latin-1")))
    lengths = {v for k, v in headers if k == "content-length"}
    codings = ",".join(v for k, v in headers if k == "transfer-encoding")
    chunked = False
    if codings:
        names = [c.strip().lower() for c in codings.split(",")]
        if names != ["chunked"]:
            raise HeadError(501, f"unsupported transfer coding {codings[:40]!r}")
        if lengths:
            raise HeadError(400, "both Content-Length and Transfer-Encoding")
        if version == "HTTP/1.0":
            raise HeadError(400, "chunked body in an HTTP/1.0 request")
        chunked = True
    length: int | None = None
    if lengths:
        if len(lengths) > 1 or not all(c in "0123456789" for c in next(iter(lengths))) \
                or not next(iter(lengths)) or len(next(iter(lengths))) > 18:
            raise HeadError(400, "bad Content-Length")
        length = int(next(iter(lengths)))
    return Head(method, target, version, tuple(headers), length, chunked, end + 4)


class ChunkedBody:
    """An incremental reader of a chunked body: :meth:`feed` is called with the whole
    buffer each time more arrived and resumes where it stopped, so a body sent in many
    small pieces is scanned once (re-parsing from the start would be quadratic)."""

    def __init__(self, start: int, max_body: int) -> None:
        self.pos = start  # next unread byte of the buffer
        self.start = start
        self.max_body = max_body
        self.pieces: list[bytes] = []
        self.total = 0
        self.in_trailer = False
        self.end: int | None = None  # buffer offset just past the body, once complete

    @property
    def body(self) -> bytes:
        return b"".join(self.pieces)

    def feed(self, buf: bytes | bytearray) -> bool:
        """True once the body (and its trailer) is complete; HeadError when malformed
        or when its data is over ``max_body`` (413)."""
        if self.end is not None:
            return True
        while not self.in_trailer:
            eol = buf.find(CRLF, self.pos)
            if eol < 0:
                if len(buf) - self.pos > 1024:
                    raise HeadError(400, "chunk size line too long")
                return False
            size_text = bytes(buf[self.pos:eol]).split(b";", 1)[0].strip(b" \t")
            if not size_text or len(size_text) > 16 or not set(size_text) <= _HEX:
                raise HeadError(400, "malformed chunk size")
            size = int(size_text, 16)
            if size == 0:
                self.pos = eol + 2
                self.in_trailer = True
                break
            if self.total + size > self.max_body:
                raise HeadError(413, f"body over {self.max_body} bytes")
            data_at = eol + 2
            if len(buf) < data_at + size + 2:
                return False  # the size line is read again next time: it is short
            if buf[data_at + size:data_at + size + 2] != CRLF:
                raise HeadError(400, "chunk not followed by CRLF")
            self.pieces.append(bytes(buf[data_at:data_at + size]))
            self.total += size
            self.pos = data_at + size + 2
        while True:  # trailer fields, then an empty line
            eol = buf.find(CRLF, self.pos)
            if eol < 0:
                if len(buf) - self.pos > 8192:
                    raise HeadError(400, "trailer line too long")
                return False
            if eol == self.pos:
                self.end = eol + 2
                return True
            self.pos = eol + 2
