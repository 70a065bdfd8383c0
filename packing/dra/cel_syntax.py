"""The syntax of the CEL subset :mod:`packing.dra.cel` evaluates: a lexer and a recursive
descent parser after CEL's grammar (``?:``, ``||``, ``&&``, relations with ``in``,
``+ -``, ``* / %``, unary ``! -``, member selection, indexing, calls, list literals,
``has()``). Syntax outside the subset (map literals, bytes, unsigned ints, the
comprehension macros) parses to an ``("unk", why)`` node, never to an error: the API
server accepted the expression, so it is valid CEL that this parser does not know.

Pure: no I/O.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

# --- lexer ---------------------------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<ws>\s+|//[^\n]*)
  | (?P<num>0[xX][0-9a-fA-F]+[uU]?|\d*\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+[uU]?)
  | (?P<str>[rR]?[bB]?[rR]?(?:'''(?:.|\n)*?'''|\"\"\"(?:.|\n)*?\"\"\"
            |'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))
  | (?P<id>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>&&|\|\||==|!=|<=|>=|[-+*/%!<>?:.,\[\](){}])
""", re.VERBOSE)


class _Unsupported(Exception):
    """Syntax outside the subset (the expression is UNKNOWN)."""


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "a": "\a",
            "b": "\b", "f": "\f", "v": "\v", "?": "?", "`": "`"}


def _string_literal(text: str) -> str:
    prefix = ""
    while text[0] in "rRbB":
        prefix += text[0].lower()
        text = text[1:]
    if "b" in prefix:
        raise _Unsupported("bytes literal")
    quote = 3 if text[:3] in ("'''", '"""') else 1
    body = text[quote:-quote]
    if "r" in prefix:
        return body
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt in "uU":
            width = 4 if nxt == "u" else 8
            out.append(chr(int(body[i + 2:i + 2 + width], 16)))
            i += 2 + width
        elif nxt in "xX":
            out.append(chr(int(body[i + 2:i + 4], 16)))
            i += 4
        elif nxt in "01234567":
            out.append(chr(int(body[i + 1:i + 4], 8)))
            i += 4
        else:
            raise _Unsupported(f"escape \\{nxt}")
    return "".join(out)


def _tokens(src: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if m is None:
            raise _Unsupported(f"unexpected {src[pos:pos + 10]!r}")
        pos = m.end()
        kind = m.lastgroup or ""
        if kind != "ws":
            out.append((kind, m.group()))
    out.append(("end", ""))
    return out


# --- parser --------------------------------------------------------------------------
# The AST is nested tuples: ("lit", v), ("id", name), ("sel", x, name), ("idx", x, k),
# ("call", name, target|None, args), ("un", op, x), ("bin", op, a, b),
# ("cond", c, a, b), ("list", items), ("has", x, name), ("unk", why).

Node = tuple[Any, ...]
_MACROS = ("all", "exists", "exists_one", "map", "filter")


class _Parser:
    def __init__(self, src: str) -> None:
        self.toks = _tokens(src)
        self.i = 0

    def peek(self, value: str) -> bool:
        return self.toks[self.i][1] == value and self.toks[self.i][0] == "op"

    def take(self, value: str) -> None:
        if not self.peek(value):
            raise _Unsupported(f"expected {value!r}, got {self.toks[self.i][1]!r}")
        self.i += 1

    def parse(self) -> Node:
        node = self.expr()
        if self.toks[self.i][0] != "end":
            raise _Unsupported(f"unexpected {self.toks[self.i][1]!r}")
        return node

    def expr(self) -> Node:
        cond = self.binary(0)
        if self.peek("?"):
            self.take("?")
            a = self.binary(0)
            self.take(":")
            return ("cond", cond, a, self.expr())
        return cond

    _LEVELS: tuple[tuple[str, ...], ...] = (("||",), ("&&",), ("==", "!=", "<", "<=", ">", ">=",
                                                              "in"), ("+", "-"), ("*", "/", "%"))

    def binary(self, level: int) -> Node:
        if level == len(self._LEVELS):
            return self.unary()
        node = self.binary(level + 1)
        while True:
            kind, text = self.toks[self.i]
            if text in self._LEVELS[level] and (kind == "op" or (kind == "id" and text == "in")):
                self.i += 1
                node = ("bin", text, node, self.binary(level + 1))
            else:
                return node

    def unary(self) -> Node:
        if self.peek("!") or self.peek("-"):
            op = self.toks[self.i][1]
            self.i += 1
            return ("un", op, self.unary())
        return self.member()

    def args(self) -> list[Node]:
        self.take("(")
        out: list[Node] = []
        while not self.peek(")"):
            out.append(self.expr())
            if not self.peek(")"):
                self.take(",")
        self.take(")")
        return out

    def member(self) -> Node:
        node = self.primary()
        while True:
            if self.peek("."):
                self.take(".")
                kind, name = self.toks[self.i]
                if kind != "id":
                    raise _Unsupported("field name expected")
                self.i += 1
                if self.peek("("):
                    if name in _MACROS:
                        self.args_skip()
                        node = ("unk", f"macro {name}()")
                    else:
                        node = ("call", name, node, self.args())
                else:
                    node = ("sel", node, name)
            elif self.peek("["):
                self.take("[")
                key = self.expr()
                self.take("]")
                node = ("idx", node, key)
            else:
                return node

    def args_skip(self) -> None:
        depth = 0
        while True:
            kind, text = self.toks[self.i]
            if kind == "end":
                raise _Unsupported("unbalanced parentheses")
            self.i += 1
            if kind == "op" and text in "([{":
                depth += 1
            elif kind == "op" and text in ")]}":
                depth -= 1
                if depth == 0:
                    return

    def primary(self) -> Node:
        kind, text = self.toks[self.i]
        if kind == "num":
            self.i += 1
            return ("lit", _number(text))
        if kind == "str":
            self.i += 1
            return ("lit", _string_literal(text))
        if kind == "id":
            self.i += 1
            if text in ("true", "false"):
                return ("lit", text == "true")
            if text == "null":
                return ("lit", None)
            if self.peek("("):
                if text == "has":
                    args = self.args()
                    if len(args) != 1 or args[0][0] != "sel":
                        raise _Unsupported("has() needs a field selection")
                    return ("has", args[0][1], args[0][2])
                return ("call", text, None, self.args())
            return ("id", text)
        if self.peek("("):
            self.take("(")
            node = self.expr()
            self.take(")")
            return node
        if self.peek("["):
            self.take("[")
            items: list[Node] = []
            while not self.peek("]"):
                items.append(self.expr())
                if not self.peek("]"):
                    self.take(",")
            self.take("]")
            return ("list", items)
        raise _Unsupported(f"unexpected {text!r}")


def _number(text: str) -> int | float:
    if text[-1] in "uU":
        raise _Unsupported("unsigned integer literal")
    if text[:2].lower() == "0x":
        return int(text, 16)
    if any(c in text for c in ".eE"):
        return float(text)
    return int(text)


@lru_cache(maxsize=1024)
def compile_expression(src: str) -> Node:
    """The AST of a selector (cached: classes repeat few expressions), or an
    ``("unk", why)`` node when the syntax is outside the subset."""
    try:
        return _Parser(src).parse()
    except (_Unsupported, IndexError, ValueError) as e:
        return ("unk", f"syntax outside the evaluated subset: {e}")
