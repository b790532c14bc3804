"""When a fit asks MLflow about autologging (sparkdl.driver.tracking.wanted)."""

from __future__ import annotations

import sys

import pytest

from sparkdl.driver.tracking import wanted


def test_autologging_is_not_asked_of_an_mlflow_nobody_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [m for m in sys.modules if m == "mlflow" or m.startswith("mlflow.")]:
        monkeypatch.delitem(sys.modules, name)
    assert wanted(None) is False
    assert "mlflow" not in sys.modules  # not imported (seconds) just to ask
    assert wanted(True) is True and wanted(False) is False
