"""Shared test set-up: repo root on sys.path, quiet TensorFlow, GPU marker."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


#: tests/connect runs in a pytest process of its own (see its conftest).
collect_ignore = [] if os.environ.get("SPARKDL_CONNECT_TESTS") == "1" else ["connect"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import shutil

    if shutil.which("nvidia-smi"):
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
