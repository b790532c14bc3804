"""notebooks/quickstart.ipynb runs top to bottom under nbclient, so it never rots."""

from __future__ import annotations

import os
import re

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = [pytest.mark.spark, pytest.mark.slow]

NOTEBOOK = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "notebooks",
    "quickstart.ipynb",
)


def test_quickstart_notebook_runs(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # As a user's kernel: no TensorFlow log level set, so sparkdl's own quieting is tested.
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # A canary on file descriptor 2: stderr does reach the cells, so the absence of
    # TensorFlow's lines below means something. ipykernel forwards the descriptor from a
    # thread of its own, which may pass the text on after its cell ended: it then shows
    # in a later cell. Written first, the canary has every later cell to show in; written
    # before the last cell only (as it was), a slow thread could miss the notebook's end.
    canary = nbformat.v4.new_code_cell("import os\nos.write(2, b'canary on stderr\\n')")
    notebook.cells.insert(0, canary)
    client = NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    # ipykernel forwards file descriptor 2 into the cells, as in a user's notebook, only
    # when PYTEST_CURRENT_TEST is not in its environment.
    kernel_env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    client.execute(env=kernel_env)
    outputs = "".join(
        out.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
    )
    assert "test accuracy: 0.9" in outputs
    assert re.search(r"evaluate: \{.*'loss': [0-9.]+", outputs), outputs
    assert "same predictions after loading: True" in outputs
    # The resolved settings are shown, and no TensorFlow C++ or absl line reaches a cell
    # (ipykernel forwards file descriptor 2: the driver's and the local workers').
    assert "sparkdl fit, resolved:" in outputs
    assert "canary on stderr" in outputs, outputs
    for line in ("absl::InitializeLog", "port.cc", "cudart_stub.cc", "cuInit", "oneDNN"):
        assert line not in outputs, outputs
