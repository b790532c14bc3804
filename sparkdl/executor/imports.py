"""What a worker imports before it trains: the executor's modules, without the extras.

The training task starts :func:`import_executor` in a thread while it reads its
partition (:mod:`sparkdl.executor.task`), and the warm-up job runs it in idle Python
workers ahead of a fit (:mod:`sparkdl.driver.warmup`). It lives on the executor side so that
the task entry imports nothing of the driver's.

Example:
    >>> "sklearn" in UNUSED_ON_WORKERS
    True
"""

from __future__ import annotations

import importlib
import sys

from sparkdl.compat.imports import modules_hidden

__all__ = ["EXECUTOR_MODULE", "UNUSED_ON_WORKERS", "import_executor"]

#: Packages Keras imports as it loads, when they are installed, for features a Spark
#: worker never runs: scikit-learn for ``keras.wrappers``, matplotlib for
#: ``keras.visualization``. :func:`import_executor` loads Keras without them (about 2 of
#: the 7 seconds a worker took to import TensorFlow and Keras on a 2-core machine).
UNUSED_ON_WORKERS = ("sklearn", "matplotlib")

#: The module whose import brings TensorFlow, Keras and the training loop.
EXECUTOR_MODULE = "sparkdl.executor.training"


def import_executor(module: str = EXECUTOR_MODULE) -> None:
    """Imports the executor's training module (TensorFlow and Keras) in this worker,
    without the packages of :data:`UNUSED_ON_WORKERS`.

    Keras imports scikit-learn and matplotlib, when it finds them, for its sklearn
    wrappers and image galleries. While the import runs, those not yet loaded are
    marked missing (:func:`sparkdl.compat.imports.modules_hidden`), so Keras takes them
    as not installed (its ``try: import sklearn / except ImportError`` path); the marks
    are removed after, so later code of this worker imports them as usual. Keras's
    sklearn wrappers and ``keras.visualization`` then do not work in this worker process
    (the driver is untouched); pandas, which Keras's data adapters use, is imported as
    usual.

    Args:
        module: The module to import.

    Example:
        >>> import_executor("json")
    """
    if module in sys.modules:
        return
    with modules_hidden(UNUSED_ON_WORKERS):
        importlib.import_module(module)
