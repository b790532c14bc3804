"""Checkpoints of a fit on the driver, and resuming from the newest one.

After every epoch the driver writes ``<checkpoint_dir>/ckpt-<epoch>/`` holding the
center weights (``weights.sdlw``: sparkdl's wire format, no pickle), the outer
optimizer's state when the fit has one (``outer.sdlw``: :mod:`sparkdl.sync.outer`) and
``state.json`` (the epoch, the history so far, and the fit's settings), then keeps the newest
``checkpoint_keep``. A checkpoint is written into a temporary directory, its files and
the directory fsynced, and renamed into place (the parent fsynced after), so a driver
that dies mid-write leaves at worst a ``.tmp-*`` directory that resuming ignores: the
newest ``ckpt-*`` is always complete. A checkpoint of an epoch that already has one (a
resumed fit that redoes it) is renamed in as the next revision, ``ckpt-<epoch>-r<n>``,
before the older one is removed: a crash between the two leaves both, and resuming
takes the newer revision. No moment is without a complete checkpoint of that epoch.

Example:
    >>> checkpoint_name(7)
    'ckpt-000007'
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkdl.errors import ConfigError
from sparkdl.protocol import wire

__all__ = [
    "Checkpoint",
    "checkpoint_callback",
    "checkpoint_name",
    "discard_after",
    "epochs",
    "latest",
    "latest_epoch",
    "write",
]

_NAME = re.compile(r"^ckpt-(\d{6})(?:-r(\d+))?$")


def checkpoint_name(epoch: int) -> str:
    """The directory name of the checkpoint taken after ``epoch`` epochs."""
    return f"ckpt-{epoch:06d}"


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint read back: epochs done, weights, history and settings."""

    epoch: int
    weights: list[np.ndarray]
    history: dict[str, list[float]]
    settings: dict[str, Any]
    path: str
    outer: tuple[list[np.ndarray], int] | None = None


def write(
    directory: str,
    epoch: int,
    weights: list[np.ndarray],
    history: dict[str, list[float]],
    settings: dict[str, Any],
    keep: int,
    outer: tuple[Sequence[np.ndarray], int] | None = None,
) -> str:
    """Writes one checkpoint atomically and prunes all but the newest ``keep``;
    ``outer``: the outer optimizer's arrays and push count."""
    root = _local(directory)
    os.makedirs(root, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f"{checkpoint_name(epoch)}.tmp-", dir=root)
    with open(os.path.join(staging, "weights.sdlw"), "wb") as f:
        for chunk in wire.encode([np.asarray(w) for w in weights], {"epoch": epoch}):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    state: dict[str, Any] = {"epoch": epoch, "history": history, "settings": settings}
    if outer is not None:
        with open(os.path.join(staging, "outer.sdlw"), "wb") as f:
            for chunk in wire.encode([np.asarray(a) for a in outer[0]], {"pushes": outer[1]}):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        state["outer_pushes"] = int(outer[1])
    with open(os.path.join(staging, "state.json"), "w") as f:
        json.dump(state, f, default=str)
        f.flush()
        os.fsync(f.fileno())
    _fsync_directory(staging)
    same = [n for n in _complete(root) if _key(n)[0] == epoch]
    name = checkpoint_name(epoch)
    if same:
        name = f"{name}-r{_key(same[-1])[1] + 1}"
    final = os.path.join(root, name)
    os.rename(staging, final)  # atomic: the checkpoint appears whole or not at all
    _fsync_directory(root)
    for older in same:  # replaced: the new revision is in place first
        shutil.rmtree(os.path.join(root, older), ignore_errors=True)
    for old in _epochs(root)[:-keep]:
        for stale in [n for n in _complete(root) if _key(n)[0] == old]:
            shutil.rmtree(os.path.join(root, stale), ignore_errors=True)
    return final


def latest(directory: str, epoch: int | None = None) -> Checkpoint | None:
    """The newest complete checkpoint in ``directory`` (the newest of ``epoch`` when
    given), or ``None`` if there is none."""
    root = _local(directory)
    if not os.path.isdir(root):
        return None
    names = [n for n in _complete(root) if epoch is None or _key(n)[0] == epoch]
    if not names:
        return None
    path = os.path.join(root, names[-1])
    with open(os.path.join(path, "weights.sdlw"), "rb") as f:
        arrays, _ = wire.decode(f.read())
    with open(os.path.join(path, "state.json")) as f:
        state = json.load(f)
    outer = None
    if "outer_pushes" in state:
        with open(os.path.join(path, "outer.sdlw"), "rb") as f:
            saved, _ = wire.decode(f.read())
        outer = ([np.array(a) for a in saved], int(state["outer_pushes"]))
    return Checkpoint(
        epoch=int(state["epoch"]),
        weights=[np.array(a) for a in arrays],
        history={k: [float(v) for v in vs] for k, vs in state["history"].items()},
        settings=dict(state.get("settings", {})),
        path=path,
        outer=outer,
    )


def latest_epoch(directory: str) -> int | None:
    """Epochs done at the newest complete checkpoint in ``directory`` (its name only,
    nothing read), or ``None`` if there is none."""
    root = _local(directory)
    names = _complete(root) if os.path.isdir(root) else []
    return _key(names[-1])[0] if names else None


def epochs(directory: str) -> list[int]:
    """The epochs ``directory`` holds a complete checkpoint of, oldest first (names
    only, nothing read)."""
    root = _local(directory)
    return _epochs(root) if os.path.isdir(root) else []


def discard_after(directory: str, epoch: int | None) -> None:
    """Removes the checkpoints of ``directory`` newer than ``epoch`` (all of them for
    ``None``), every revision of each."""
    root = _local(directory)
    if not os.path.isdir(root):
        return
    for name in _complete(root):
        if epoch is None or _key(name)[0] > epoch:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def checkpoint_callback(
    directory: str,
    keep: int,
    settings: dict[str, Any],
    history: dict[str, list[float]],
    outer: Callable[[], tuple[list[np.ndarray], int] | None] | None = None,
) -> Any:
    """A Keras callback (for the driver's master model) that checkpoints every epoch;
    ``outer`` reads the service's outer optimizer state to keep beside the weights."""
    import keras

    class _Checkpoints(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.history = {k: list(v) for k, v in history.items()}

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            for key, value in (logs or {}).items():
                self.history.setdefault(key, []).append(float(value))
            state = outer() if outer is not None else None
            write(
                directory,
                epoch + 1,
                self.model.get_weights(),
                self.history,
                settings,
                keep,
                outer=state,
            )

    return _Checkpoints()


def _complete(root: str) -> list[str]:
    """The checkpoint directories in ``root``, oldest first (by epoch, then revision)."""
    return sorted((n for n in os.listdir(root) if _NAME.match(n)), key=_key)


def _epochs(root: str) -> list[int]:
    return sorted({_key(n)[0] for n in _complete(root)})


def _key(name: str) -> tuple[int, int]:
    """``(epoch, revision)`` of a checkpoint directory's name."""
    match = _NAME.match(name)
    assert match is not None
    return int(match.group(1)), int(match.group(2) or 0)


def _fsync_directory(path: str) -> None:
    """Makes the entries of a directory durable (a no-op where the OS cannot)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _local(directory: str) -> str:
    if directory.startswith("file://"):
        return directory[len("file://") :]
    if "://" in directory:
        raise ConfigError(
            f"checkpoint_dir must be a local path on the driver (or file://). Received: "
            f"{directory!r}. Save the fitted model to distributed storage with save()."
        )
    return directory
