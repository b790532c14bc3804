"""A worker's failure as the service receives it (``POST /fail``) and as the driver
names it: the traceback, preceded by where in training it happened, and the headline
read back from it.

A worker marks an exception with its position (:func:`mark`: epoch and batch) on its
way out of training; :func:`failure_text` formats the traceback with that position on
its first line; the driver reads the position and the exception's own line back
(:func:`headline`), so that the error it raises says in its first line what went wrong
and where, whatever the traceback's length and however the message is laid out (a
Keras error's first line only says which layer's call failed; the cause is the next).

Example:
    >>> try:
    ...     raise ValueError("bad shape")
    ... except ValueError as exc:
    ...     text = failure_text(mark(exc, "epoch 2, batch 7"))
    >>> headline(text)
    ('epoch 2, batch 7', 'ValueError: bad shape')
"""

from __future__ import annotations

import contextlib
import re
import traceback

__all__ = ["LIMIT", "failure_text", "headline", "mark"]

#: Characters of a failure's text a worker sends (the service keeps as many).
LIMIT = 20_000
#: Starts the first line of a failure's text when the worker knew where it stood.
_WHERE = "sparkdl worker position: "
_ATTRIBUTE = "_sparkdl_position"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: Keras's first line of an error raised in a layer's call; the cause follows.
_KERAS_CALL = re.compile(r"Exception encountered when calling [\w.]+\.call\(\)\.?$")
_HEADLINE_CHARS = 400


def mark(exc: BaseException, where: str) -> BaseException:
    """Records where in training ``exc`` was raised (the first mark stays: it is the
    innermost) and returns it."""
    if not hasattr(exc, _ATTRIBUTE):
        with contextlib.suppress(AttributeError):  # a type without a __dict__
            setattr(exc, _ATTRIBUTE, where)
    return exc


def failure_text(exc: BaseException) -> str:
    """``exc``'s traceback after its position line when :func:`mark` gave it one, at
    most :data:`LIMIT` characters (the traceback's end: the innermost frames)."""
    where = getattr(exc, _ATTRIBUTE, None)
    first = f"{_WHERE}{where}\n" if where else ""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return first + text[-(LIMIT - len(first)) :]


def headline(text: str) -> tuple[str | None, str]:
    """``(position or None, "Type: message")`` of a failure's text: the exception line
    of its last traceback (the one raised out of the worker), with Keras's cause when
    the line only names the layer call, colour codes removed.

    Example:
        >>> headline("Traceback (most recent call last):\\n  File 'x'\\n    f()\\n"
        ...          "ValueError: Exception encountered when calling Functional.call().\\n"
        ...          "\\n\\x1b[1mThe structure of `inputs` doesn't match.\\x1b[0m\\n"
        ...          "  • kwargs=<class 'inspect._empty'>")
        (None, "ValueError: Exception encountered when calling Functional.call(). The structure of `inputs` doesn't match.")
    """  # noqa: E501
    lines = _ANSI.sub("", text).strip().splitlines()
    where = None
    if lines and lines[0].startswith(_WHERE):
        where = lines.pop(0)[len(_WHERE) :].strip() or None
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
    block = lines[starts[-1] + 1 :] if starts else []
    found = next((i for i, line in enumerate(block) if line and not line[0].isspace()), None)
    if found is None:  # not a Python traceback: its last line
        return where, (lines[-1].strip() if lines else "")[:_HEADLINE_CHARS]
    line = block[found].strip()
    if _KERAS_CALL.search(line):
        cause = next((rest.strip() for rest in block[found + 1 :] if rest.strip()), "")
        line = f"{line} {cause}".strip()
    return where, line[:_HEADLINE_CHARS]
