"""How the weights split across the shards of a sharded parameter service.

With ``service_shards=k`` the service is k services, each holding a contiguous part of
the weights (DistBelief's parameter-server shards): a worker sends each shard its part
of every push, concurrently, so no one host moves every byte. :class:`ShardLayout`
decides the parts once, on the driver, from the weights' shapes and dtypes alone, and
travels to the workers in the plan.

The parts are of about equal bytes. The weights, in the model's order, are cut at
``j x total / k`` bytes (``j = 1 .. k-1``); a cut that falls inside a small variable
(at most half a shard's bytes) moves to that variable's nearer end, so small
variables stay whole; inside a large one it falls on a row boundary (the first axis),
so each part of a variable is a view of its rows and joins back with one
concatenation. Every shard holds at least one row.

Every merge works element by element, so a synchronous shard merging its parts
computes exactly what one service merging the whole weights does
(``tests/integration/test_sharded_service.py``, ``test_sharded_fits.py``). Codecs
work per array, so on a cut variable top-k and sign select and scale per part: close
to, not exactly, one service's result.

Example:
    >>> import numpy as np
    >>> layout = ShardLayout.plan([((100, 10), "float32"), ((10,), "float32")], shards=2)
    >>> [[(p.variable, p.start, p.stop) for p in s] for s in layout.shards]
    [[(0, 0, 50)], [(0, 50, 100), (1, 0, 10)]]
    >>> parts = layout.split([np.ones((100, 10), np.float32), np.zeros(10, np.float32)])
    >>> [a.shape for a in layout.join(parts)]
    [(100, 10), (10,)]
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkdl.errors import ConfigError

__all__ = ["Piece", "ShardLayout", "join_outer", "joined_status", "split_outer"]

#: A variable of at most this share of a shard's bytes is never split.
_SMALL_SHARE = 0.5


@dataclass(frozen=True)
class Piece:
    """Rows ``start:stop`` (first axis) of variable ``variable``; a scalar is ``0:1``."""

    variable: int
    start: int
    stop: int


@dataclass(frozen=True)
class ShardLayout:
    """Which rows of which variables each shard holds.

    Attributes:
        shapes: Every variable's shape.
        shards: Per shard, its pieces in the model's order.
    """

    shapes: tuple[tuple[int, ...], ...]
    shards: tuple[tuple[Piece, ...], ...]

    @classmethod
    def plan(cls, specs: Sequence[tuple[Sequence[int], Any]], shards: int) -> ShardLayout:
        """Splits variables of these ``(shape, dtype)`` into ``shards`` parts of about
        equal bytes.

        Raises:
            ConfigError: Fewer rows in all than shards.
        """
        shapes = tuple(tuple(int(d) for d in shape) for shape, _ in specs)
        rows = [shape[0] if shape else 1 for shape in shapes]
        row_bytes = [
            int(np.dtype(dtype).itemsize * np.prod(shape[1:] if shape else (), dtype=np.int64))
            for (_, dtype), shape in zip(specs, shapes, strict=True)
        ]
        if shards < 1 or sum(rows) < shards:
            raise ConfigError(
                f"service_shards={shards} is more than the model's weights split into "
                f"({sum(rows)} rows in all). Use fewer shards."
            )
        cuts = _cuts(rows, row_bytes, shards)
        return cls(shapes, _pieces(rows, cuts))

    @property
    def count(self) -> int:
        """The number of shards."""
        return len(self.shards)

    def split(self, arrays: Sequence[np.ndarray]) -> list[list[np.ndarray]]:
        """Per shard, its parts of ``arrays`` (views of their rows, no copy)."""
        return [[_rows(arrays[p.variable], p) for p in pieces] for pieces in self.shards]

    def join(self, parts: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
        """The whole arrays from every shard's parts (the inverse of :meth:`split`)."""
        found: list[list[np.ndarray]] = [[] for _ in self.shapes]
        for pieces, arrays in zip(self.shards, parts, strict=True):
            for piece, array in zip(pieces, arrays, strict=True):
                found[piece.variable].append(array)
        out = []
        for shape, rows in zip(self.shapes, found, strict=True):
            whole = rows[0] if len(rows) == 1 else np.concatenate(rows)
            out.append(whole.reshape(shape))
        return out

    def shard_bytes(self, itemsizes: Sequence[int]) -> list[int]:
        """Bytes each shard holds, for these per-variable item sizes."""
        return [
            sum(
                (p.stop - p.start)
                * int(np.prod(self.shapes[p.variable][1:], dtype=np.int64))
                * itemsizes[p.variable]
                for p in pieces
            )
            for pieces in self.shards
        ]

    def to_json(self) -> dict[str, Any]:
        """Plain lists, for the plan's JSON."""
        return {
            "shapes": [list(s) for s in self.shapes],
            "shards": [[[p.variable, p.start, p.stop] for p in s] for s in self.shards],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShardLayout:
        """The layout :meth:`to_json` wrote."""
        return cls(
            tuple(tuple(int(d) for d in s) for s in data["shapes"]),
            tuple(tuple(Piece(int(v), int(a), int(b)) for v, a, b in s) for s in data["shards"]),
        )


def join_outer(
    layout: ShardLayout, states: Sequence[tuple[Sequence[np.ndarray], int]]
) -> list[np.ndarray]:
    """The shards' outer optimizer arrays (each its part of the momentum, then of the
    accumulated pseudo-gradients: :meth:`sparkdl.sync.outer.OuterState.arrays`) joined
    into the whole weights' shapes, in the same order."""
    halves: list[list[list[np.ndarray]]] = [[], []]
    for arrays, _ in states:
        half = len(arrays) // 2
        halves[0].append(list(arrays[:half]))
        halves[1].append(list(arrays[half:]))
    return layout.join(halves[0]) + layout.join(halves[1])


def split_outer(layout: ShardLayout, arrays: Sequence[np.ndarray]) -> list[list[np.ndarray]]:
    """The whole outer optimizer arrays (:func:`join_outer`'s result) as each shard's."""
    half = len(arrays) // 2
    momentum, accumulated = layout.split(arrays[:half]), layout.split(arrays[half:])
    return [m + a for m, a in zip(momentum, accumulated, strict=True)]


def joined_status(statuses: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The fit's status from its shards' service statuses, in shard order.

    Shard 0's, with the epochs every shard closed (``epochs_done``), any shard's abort
    or stop, each shard's version, samples, epochs and traffic (``shards``), the
    traffic of all of them together, and every failure any shard holds.

    Example:
        >>> one = {"version": 3, "samples_seen": 9, "epochs_done": 2, "failures": {},
        ...        "traffic": {"requests": 4}}
        >>> joined_status([one, dict(one, epochs_done=1)])["epochs_done"]
        1
    """
    status = dict(statuses[0])
    status["epochs_done"] = min(int(s["epochs_done"]) for s in statuses)
    # A shard in the cluster aborts or stops on its own (a worker's fatal failure
    # reaches every shard, but one may be told first): the fit's state is any shard's.
    status["aborted"] = next((s.get("aborted") for s in statuses if s.get("aborted")), None)
    for key in ("stop_requested", "finished"):
        if key in status:
            status[key] = any(s.get(key) for s in statuses)
    status["shards"] = [
        {
            "shard": j,
            "version": s["version"],
            "samples_seen": s["samples_seen"],
            "epochs_done": s["epochs_done"],
            "initial_epochs": s.get("initial_epochs"),
            "traffic": s["traffic"],
        }
        for j, s in enumerate(statuses)
    ]
    status["traffic"] = {
        key: sum(s["traffic"][key] for s in statuses) for key in statuses[0]["traffic"]
    }
    failures: dict[str, str] = {}
    for s in statuses:
        for worker, trace in s["failures"].items():
            failures.setdefault(str(worker), trace)
    status["failures"] = failures
    return status


def _cuts(rows: list[int], row_bytes: list[int], shards: int) -> list[tuple[int, int]]:
    """The k-1 cut points, each ``(variable, row)``: the first row of the next shard."""
    total = sum(r * b for r, b in zip(rows, row_bytes, strict=True))
    target = total / shards
    starts = np.cumsum([0] + [r * b for r, b in zip(rows, row_bytes, strict=True)])
    cuts: list[tuple[int, int]] = []
    for j in range(1, shards):
        at = j * target
        var = int(np.searchsorted(starts, at, side="right")) - 1
        var = min(max(var, 0), len(rows) - 1)
        size = rows[var] * row_bytes[var]
        offset = at - starts[var]
        if size <= _SMALL_SHARE * target or rows[var] == 1:
            cut = (var, 0) if offset < size / 2 else (var + 1, 0)
        else:
            cut = (var, round(offset / max(row_bytes[var], 1)))
        cuts.append(_normalised(cut, rows))
    return _spread(cuts, rows)


def _normalised(cut: tuple[int, int], rows: list[int]) -> tuple[int, int]:
    var, row = cut
    while var < len(rows) and row >= rows[var]:
        var, row = var + 1, 0
    return var, row


def _spread(cuts: list[tuple[int, int]], rows: list[int]) -> list[tuple[int, int]]:
    """Moves cuts apart so every shard holds at least one row (a tiny model's cuts
    may coincide), keeping them in order."""
    flat = [0]
    for r in rows:
        flat.append(flat[-1] + r)
    position = [flat[v] + r if v < len(rows) else flat[-1] for v, r in cuts]
    total = flat[-1]
    for j in range(len(position)):  # at least one row after the previous cut
        position[j] = max(position[j], (position[j - 1] if j else 0) + 1)
    for j in reversed(range(len(position))):  # and one before the next
        position[j] = min(position[j], (position[j + 1] if j + 1 < len(position) else total) - 1)
    out = []
    for p in position:
        var = int(np.searchsorted(flat, p, side="right")) - 1
        out.append((var, p - flat[var]))
    return out


def _pieces(rows: list[int], cuts: list[tuple[int, int]]) -> tuple[tuple[Piece, ...], ...]:
    bounds = [(0, 0), *cuts, (len(rows), 0)]
    shards = []
    for (v0, r0), (v1, r1) in itertools.pairwise(bounds):
        pieces = []
        for var in range(v0, min(v1, len(rows) - 1) + 1):
            start = r0 if var == v0 else 0
            stop = r1 if var == v1 else rows[var]
            if stop > start:
                pieces.append(Piece(var, start, stop))
        shards.append(tuple(pieces))
    return tuple(shards)


def _rows(array: np.ndarray, piece: Piece) -> np.ndarray:
    if array.ndim == 0:
        return array.reshape(1)
    if piece.start == 0 and piece.stop == array.shape[0]:
        return array
    return array[piece.start : piece.stop]
