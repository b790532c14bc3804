"""What the gate reads of a request head before a thread sees it.

The gate (:mod:`sparkdl.server.web.gate`) holds a connection until its request can be
served without waiting: it must know where the head ends, how long the body is, and
whether the request carries the fit's token (only then is a body worth waiting for).
It must also refuse a head whose framing two parsers could read two ways, as RFC 9112
requires: cheroot takes the last of two different ``Content-Length`` headers and
serves what the first one covered as a second request, and a field name with
whitespace before its colon, or a second ``Authorization``, was taken as well.
:func:`parse_head` refuses each of these (:class:`FramingError`, answered 400 and the
connection closed), and a head ending in bare ``\\n`` line feeds, which cheroot never
saw the end of.

Example:
    >>> head = parse_head(b"POST /push HTTP/1.1\\r\\nContent-Length: 5\\r\\n\\r\\nhello")
    >>> head.size, head.length, head.authorization
    (42, 5, None)
    >>> parse_head(b"GET / HTTP/1.1\\r\\nHost: x") is None  # not whole yet
    True
    >>> try:
    ...     parse_head(b"POST / HTTP/1.1\\r\\nContent-Length: 1\\r\\nContent-Length: 2\\r\\n\\r\\n")
    ... except FramingError as exc:
    ...     print(exc)
    Two different Content-Length headers: send one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["HEAD_END", "FramingError", "Head", "parse_head"]

#: The blank line that ends a request head.
HEAD_END = b"\r\n\r\n"
_BARE_END = b"\n\n"
#: A field name (RFC 9110 ``token``): cheroot strips any whitespace around a name, so
#: ``Content-Length\x0b:`` would count as ``Content-Length`` there and not here.
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
#: Control bytes a field value may not hold (horizontal tab is allowed).
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


class FramingError(ValueError):
    """A request head whose framing or field syntax is refused (400)."""


@dataclass(frozen=True)
class Head:
    """A whole request head, as the gate needs it.

    Attributes:
        size: Bytes of the head, the empty line that ends it included (and one empty
            line before the request line, which cheroot skips).
        length: The announced ``Content-Length``, or ``None``.
        authorization: The ``Authorization`` field's value, or ``None``.
        chunked: A ``Transfer-Encoding`` was sent (the app refuses it with 411).
        expects_continue: ``Expect: 100-continue``: the client waits for a 100 before
            it sends the body (cheroot sends it when the app reads the body).
    """

    size: int
    length: int | None
    authorization: bytes | None
    chunked: bool = False
    expects_continue: bool = False


def parse_head(data: bytes) -> Head | None:
    """The request head at the start of ``data``, or ``None`` while it is not whole.

    Raises:
        FramingError: The head ends in bare line feeds, or its fields frame the body
            ambiguously: two different ``Content-Length`` values, ``Content-Length``
            beside ``Transfer-Encoding``, a length that is not digits, whitespace
            before a colon, a folded line, or two ``Authorization`` fields.
    """
    start = 2 if data.startswith(b"\r\n") else 0
    end = data.find(HEAD_END, start)
    bare = data.find(_BARE_END, start)
    if bare != -1 and (end == -1 or bare < end):
        raise FramingError("Request head lines must end with CRLF (\\r\\n), not a bare \\n.")
    if end == -1:
        return None
    fields = data[start:end].split(b"\r\n")[1:]
    lengths: set[bytes] = set()
    authorizations: list[bytes] = []
    chunked = expects = False
    for line in fields:
        name, value = _field(line)
        if name == b"expect":
            expects = value.lower() == b"100-continue"
        elif name == b"content-length":
            lengths.update(part.strip(b" \t") for part in value.split(b","))
        elif name == b"transfer-encoding":
            chunked = True
        elif name == b"authorization":
            authorizations.append(value)
    if len(lengths) > 1:
        raise FramingError("Two different Content-Length headers: send one.")
    if chunked and lengths:
        raise FramingError("Both Content-Length and Transfer-Encoding: send Content-Length only.")
    if len(authorizations) > 1:
        raise FramingError("Two Authorization headers: send one.")
    length = None
    if lengths:
        text = next(iter(lengths))
        if not text.isdigit() or len(text) > 19:
            raise FramingError("Content-Length must be a decimal number of bytes.")
        length = int(text)
    return Head(
        size=end + len(HEAD_END),
        length=length,
        authorization=authorizations[0] if authorizations else None,
        chunked=chunked,
        expects_continue=expects,
    )


def _field(line: bytes) -> tuple[bytes, bytes]:
    """A header line's lower-cased name and its value, stripped.

    Raises:
        FramingError: A folded line, no colon, a name that is not a token (whitespace or
            a control byte in or around it), or a control byte in the value.
    """
    if line[:1] in (b" ", b"\t"):
        raise FramingError("Folded header lines (starting with whitespace) are not accepted.")
    name, colon, value = line.partition(b":")
    if not colon or not _TOKEN.match(name):
        raise FramingError(
            "Malformed header field: expected 'Name: value', the name a token with no "
            "whitespace or control byte before the colon."
        )
    if _CONTROL.search(value):
        raise FramingError("Malformed header field: a control byte in a field value.")
    return name.lower(), value.strip(b" \t")
