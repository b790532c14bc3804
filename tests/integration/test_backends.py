"""The executors run the driver's Keras backend, or say which package they lack."""

from __future__ import annotations

import os
import subprocess
import sys

import keras
import pytest

pytestmark = [pytest.mark.spark]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: A Python without each backend's package: another stack's virtual environment
#: (scripts/matrix.sh builds .venv-jax, which has no TensorFlow; .venv has neither JAX
#: nor PyTorch).
WITHOUT = {
    "tensorflow": os.path.join(ROOT, ".venv-jax", "bin", "python"),
    "jax": os.path.join(ROOT, ".venv", "bin", "python"),
    "torch": os.path.join(ROOT, ".venv", "bin", "python"),
}


def _drivers_pyspark_first(folder: str) -> str:
    """A ``PYTHONPATH`` whose ``folder`` links the driver's pyspark and py4j: the other
    stack's Python then runs the driver's PySpark (a worker must run its driver's
    version), with its own packages otherwise."""
    import py4j
    import pyspark

    for module in (pyspark, py4j):
        source = os.path.dirname(module.__file__ or "")
        os.symlink(source, os.path.join(folder, os.path.basename(source)))
    return os.pathsep.join([folder, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)


@pytest.mark.compat
@pytest.mark.slow  # a second driver process
def test_executors_without_the_backend_fail_before_training_naming_the_extra(tmp_path) -> None:
    backend = keras.backend.backend()
    python = WITHOUT[backend]
    if not os.path.exists(python):
        pytest.skip(f"{python} is missing: bash scripts/matrix.sh jax builds it")
    script = os.path.join(os.path.dirname(__file__), "backend_missing_fit.py")
    # PySpark reads the executors' Python from PYSPARK_PYTHON when the driver is a plain
    # Python process (spark.pyspark.python is spark-submit's).
    env = dict(
        os.environ,
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=python,
        PYTHONPATH=_drivers_pyspark_first(str(tmp_path)),
    )
    proc = subprocess.run(
        [sys.executable, script], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    error = next(line for line in proc.stdout.splitlines() if line.startswith(("ERROR", "FITTED")))
    assert error.startswith("ERROR WorkerError"), error
    assert f"no {backend!r} package" in error and f"sparkdl-keras[{backend}]" in error, error


@pytest.mark.compat
def test_compressed_updates_train_to_accuracy(digits) -> None:
    """Top-k updates with error feedback, synchronous every 4 batches (the codecs are
    numpy on both sides; the worker's weights come from the backend)."""
    from examples.digits import accuracy, digits_model
    from sparkdl import KerasEstimator

    train_df, _, (_, x_test, _, y_test) = digits
    fitted = KerasEstimator(
        model=digits_model(),
        mode="synchronous",
        merge="delta",
        frequency=4,
        compression="topk",
        compression_ratio=0.1,
        num_workers=2,
        epochs=20,
        batch_size=32,
        seed=0,
        verbose=0,
    ).fit(train_df)
    assert fitted.fit_report["resolved"]["backend"].startswith(
        f"Keras on {keras.backend.backend()}"
    )
    assert accuracy(fitted.get_model(), x_test, y_test) >= 0.95
