"""The pure request-head and chunked-body readers of serving.head: table-driven cases
and properties (a request split anywhere reads the same as whole)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serving.head import ChunkedBody, HeadError, parse_head

MAX = 8192


@pytest.mark.parametrize(("raw", "method", "path", "length", "chunked", "keep"), [
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", "GET", "/healthz", None, False, True),
    (b"\r\nGET /a?b=1 HTTP/1.1\r\n\r\n", "GET", "/a", None, False, True),  # RFC 9112 2.2
    (b"POST /filter HTTP/1.1\r\nContent-Length: 12\r\n\r\n", "POST", "/filter", 12, False,
     True),
    (b"POST /f HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", "POST", "/f", None, True,
     True),
    (b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n", "GET", "/", None, False, False),
    (b"GET / HTTP/1.0\r\n\r\n", "GET", "/", None, False, False),
    (b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", "GET", "/", None, False, True),
    (b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", "POST", "/", 5,
     False, True),  # repeated, equal: one length
])
def test_heads_that_are_served(raw: bytes, method: str, path: str, length: int | None,
                               chunked: bool, keep: bool) -> None:
    head = parse_head(raw, MAX)
    assert head is not None
    assert (head.method, head.path, head.content_length, head.chunked, head.keep_alive) == (
        method, path, length, chunked, keep)
    assert head.size == len(raw)


@pytest.mark.parametrize(("raw", "status"), [
    (b"GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nContent-Length: 9999999999999999999\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
    (b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    (b"GET / HTTP/2.0\r\n\r\n", 505),
    (b"GET /\r\n\r\n", 400),
    (b"GET  / HTTP/1.1\r\n\r\n", 400),
    (b"G(T / HTTP/1.1\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost : x\r\n\r\n", 400),  # space before the colon (smuggling)
    (b"GET / HTTP/1.1\r\n folded\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nX: " + b"a" * MAX + b"\r\n\r\n", 431),
    (b"GET / HTTP/1.1\r\nX: " + b"a" * (MAX + 1), 431),  # too long before its end
])
def test_heads_that_are_refused(raw: bytes, status: int) -> None:
    with pytest.raises(HeadError) as e:
        parse_head(raw, MAX)
    assert e.value.status == status


def test_an_unfinished_head_is_none() -> None:
    assert parse_head(b"GET / HTTP/1.1\r\nHost: x\r\n", MAX) is None
    assert parse_head(b"", MAX) is None


def chunked(pieces: list[bytes], trailer: bytes = b"") -> bytes:
    out = b"".join(f"{len(p):x};ext=1\r\n".encode() + p + b"\r\n" for p in pieces if p)
    return out + b"0\r\n" + trailer + b"\r\n"


@given(st.lists(st.binary(min_size=1, max_size=40), max_size=8),
       st.lists(st.integers(min_value=0, max_value=400), max_size=6),
       st.booleans())
def test_a_chunked_body_read_in_any_pieces_is_the_whole_body(
        pieces: list[bytes], cuts: list[int], trailer: bool) -> None:
    wire = b"HEAD" + chunked(pieces, b"X-T: 1\r\n" if trailer else b"") + b"NEXT"
    reader = ChunkedBody(4, max_body=10_000)
    done = False
    for cut in sorted(c for c in cuts if c < len(wire)):
        done = reader.feed(wire[:cut])
        if done:
            break
    if not done:
        assert reader.feed(wire)
    assert reader.body == b"".join(pieces)
    assert reader.end == len(wire) - len(b"NEXT")


@pytest.mark.parametrize(("wire", "status"), [
    (b"zz\r\nab\r\n0\r\n\r\n", 400),
    (b"2\r\nabc\r\n0\r\n\r\n", 400),  # data longer than its size
    (b"ffffffff\r\n", 413),  # refused from the size line, before any data arrives
    (b"1" * 2000, 400),
])
def test_chunked_bodies_that_are_refused(wire: bytes, status: int) -> None:
    with pytest.raises(HeadError) as e:
        ChunkedBody(0, max_body=1000).feed(wire)
    assert e.value.status == status
