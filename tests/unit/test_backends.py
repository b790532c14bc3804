"""sparkdl.contract.backends: the driver's backend; sparkdl.executor.backends: a worker's
checks before it imports Keras, and the one interface over what differs."""

from __future__ import annotations

import sys

import keras
import pytest

from sparkdl.contract.backends import (
    BackendError,
    check_supported,
    driver_backend,
    training_backend,
)
from sparkdl.errors import ConfigError
from sparkdl.executor.backends import backend_for

pytestmark = [pytest.mark.compat]  # both backends: run in every stack of the matrix


def test_the_driver_backend_is_the_one_keras_runs() -> None:
    assert driver_backend() == keras.backend.backend()


@pytest.mark.parametrize("backend", ["numpy", "openvino"])
def test_backends_sparkdl_does_not_train_on_are_refused_with_the_fix(backend: str) -> None:
    with pytest.raises(ConfigError, match=f"'{backend}' backend.*KERAS_BACKEND=tensorflow"):
        check_supported(backend)


def test_a_worker_that_imported_keras_on_another_backend_says_so() -> None:
    other = "jax" if keras.backend.backend() == "tensorflow" else "tensorflow"
    with pytest.raises(BackendError, match=r"spark\.python\.worker\.reuse=false"):
        backend_for(other).prepare(environ={})
    environ: dict[str, str] = {}
    backend_for(keras.backend.backend()).prepare(environ=environ)  # the same backend: nothing to do
    assert environ == {}


def test_a_worker_without_the_package_names_it_and_the_extra(monkeypatch) -> None:
    # As on an executor where Keras is not imported yet and the package is missing (no
    # entry of sys.path holds it).
    monkeypatch.delitem(sys.modules, "keras")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not _has(p, "jax")])
    with pytest.raises(BackendError, match=r"no 'jax' package.*'sparkdl-keras\[jax\]'"):
        backend_for("jax").prepare(environ={})


def _has(path: str, package: str) -> bool:
    import os

    return os.path.isdir(os.path.join(path or ".", package))


def test_a_fresh_worker_gets_the_backend_and_jax_shares_its_gpu(monkeypatch) -> None:
    backend = keras.backend.backend()  # installed here; each stack of the matrix runs one
    monkeypatch.delitem(sys.modules, "keras")
    environ: dict[str, str] = {}
    backend_for(backend).prepare(environ=environ)
    expected = {"KERAS_BACKEND": backend}
    if backend == "jax":  # no preallocation of most of the GPU
        expected["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    assert environ == expected


def test_the_plan_carries_the_backend_to_the_workers() -> None:
    from sparkdl.config import TrainConfig
    from sparkdl.contract.plan import FitPlan

    plan = FitPlan.resolve(TrainConfig(), num_workers=2, rows=100, threads=1, service_host="h")
    assert plan.backend == training_backend() == keras.backend.backend()
    assert plan.describe(None)["backend"] == f"Keras on {plan.backend} (the driver's)"


@pytest.mark.parametrize("name", ["tensorflow", "jax", "torch"])
def test_picking_a_backend_imports_none(name: str) -> None:
    """The factory and a backend's preparation load no backend package (nor Keras): a
    fresh interpreter picks either and finds none loaded."""
    import subprocess

    code = (
        "import sys\n"
        "from sparkdl.contract.backends import BackendError\n"
        "from sparkdl.executor.backends import backend_for\n"
        f"backend = backend_for({name!r})\n"
        "try:\n"
        "    backend.prepare(environ={})\n"
        "except BackendError:\n"  # its package is not installed here
        "    pass\n"
        "loaded = [m for m in ('tensorflow', 'jax', 'torch', 'keras') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_another_backend_name_is_refused_by_the_factory() -> None:
    with pytest.raises(ConfigError, match="'numpy' backend"):
        backend_for("numpy")


def test_a_model_from_a_newer_keras_names_both_versions_and_the_upgrade() -> None:
    """A newer Keras writes settings an older one refuses (3.15's initializers for 3.14):
    the load says which Keras saved it and how to upgrade."""
    import io
    import json
    import zipfile

    from sparkdl.contract.keras_io import model_from_bytes, model_to_bytes
    from sparkdl.errors import ModelError

    net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    source = zipfile.ZipFile(io.BytesIO(model_to_bytes(net)))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for item in source.infolist():
            data = source.read(item.filename)
            if item.filename == "metadata.json":
                data = json.dumps({**json.loads(data), "keras_version": "99.0.0"}).encode()
            if item.filename == "config.json":  # a setting this Keras does not take
                data = data.replace(b'"use_bias": true', b'"use_bias": true, "from_99": 1')
            archive.writestr(item, data)
    with pytest.raises(ModelError, match=r"saved by Keras 99\.0\.0.*pip install -U"):
        model_from_bytes(out.getvalue())


def test_the_recipes_requirements_leave_pyspark_to_the_runtime() -> None:
    """``python -m sparkdl.requirements`` (what conf/'s recipes install after sparkdl
    --no-deps) lists the extra's backend and no pyspark, from the installed metadata."""
    import subprocess

    from sparkdl.requirements import declared, requirements

    lines = requirements(["jax"], declared())
    assert any(r.startswith("jax") for r in lines) and any(r.startswith("keras") for r in lines)
    assert not any(r.startswith(("pyspark", "tensorflow")) for r in lines)
    out = subprocess.run(
        [sys.executable, "-m", "sparkdl.requirements", "jax"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out == lines
