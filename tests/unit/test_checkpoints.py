"""Checkpoint files on the driver: durable, and replaced atomically."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from sparkdl.server.state import checkpoints


def _write(root: str, epoch: int, value: float, keep: int = 3) -> str:
    return checkpoints.write(
        root, epoch, [np.full(2, value, np.float32)], {"loss": [value]}, {}, keep
    )


def test_a_checkpoint_and_its_directories_are_fsynced(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(checkpoints.os, "fsync", fsync)
    final = _write(str(tmp_path), 1, 1.0)
    names = [os.path.basename(p) for p in synced]
    assert "weights.sdlw" in names and "state.json" in names
    assert str(tmp_path) in synced  # the rename is durable too
    assert any(".tmp-" in os.path.basename(p) for p in synced)  # the staging directory
    assert os.path.basename(final) == "ckpt-000001"


def test_replacing_an_epochs_checkpoint_never_leaves_it_missing(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(tmp_path)
    _write(root, 3, 1.0)
    # The driver dies right after the new revision is in place, before the old one
    # is removed: both are there, and resuming takes the newer.
    monkeypatch.setattr(checkpoints.shutil, "rmtree", _crash)
    with pytest.raises(KeyboardInterrupt):
        _write(root, 3, 2.0)
    assert sorted(os.listdir(root)) == ["ckpt-000003", "ckpt-000003-r1"]
    found = checkpoints.latest(root)
    assert found is not None and found.weights[0].tolist() == [2.0, 2.0]
    monkeypatch.undo()
    _write(root, 3, 3.0)  # the next replacement removes both older revisions
    assert sorted(os.listdir(root)) == ["ckpt-000003-r2"]
    found = checkpoints.latest(root)
    assert found is not None and found.epoch == 3 and found.weights[0].tolist() == [3.0, 3.0]


def test_keep_counts_epochs_not_revisions(tmp_path: Any) -> None:
    root = str(tmp_path)
    for epoch in (1, 2, 2, 3):
        _write(root, epoch, float(epoch), keep=2)
    assert sorted(os.listdir(root)) == ["ckpt-000002-r1", "ckpt-000003"]
    found = checkpoints.latest(root)
    assert found is not None and found.epoch == 3


def _crash(path: str, ignore_errors: bool = False) -> None:
    raise KeyboardInterrupt
