"""The places where sparkdl relies on a dependency's private internals.

Each module here is the only place sparkdl touches one dependency's private internals
(attributes and methods with a leading underscore, private modules such as
``tensorflow.python``, Py4J handles on JVM objects, ``sys.modules`` marks, the text of
another library's error messages), each behind a small named function whose docstring
says which internal it reaches, why no public API does, and what it falls back to (or
which error it raises) when the internal is gone, so that an upgrade of that dependency
breaks one known module rather than code spread over the package:

* :mod:`sparkdl.compat.spark`: PySpark's ``SparkContext._jsc`` / ``_jvm`` handles (task
  slots, an empty job, Hadoop's FileSystem, the ``AppStatusStore``'s task list), a
  session's ``_jsparkSession`` (which session a setting belongs to), the text of
  Spark's job-failure exceptions, and ``Params._dummy`` / ``_resetUid``.
* :mod:`sparkdl.compat.cheroot`: the ``_pyio`` read / write buffers of cheroot's socket
  streams, the selector of its ``ConnectionManager`` (``server._connections``) and the
  per-connection ``lru_cache`` wrappers of ``HTTPConnection``.
* :mod:`sparkdl.compat.keras`: ``Layer._flatten_layers``, ``Trainer._compile_config``
  and ``BaseOptimizer._learning_rate``.
* :mod:`sparkdl.compat.tensorflow`: the eager context's ``_context_handle``.
* :mod:`sparkdl.compat.imports`: CPython's global import lock (``_imp``) and modules
  hidden from Keras in ``sys.modules``.
* :mod:`sparkdl.compat.mlflow`: ``mlflow.utils.autologging_utils``.
* :mod:`sparkdl.compat.http_client`: ``http.client.HTTPConnection._send_output`` and
  its ``_buffer`` of header lines.
* :mod:`sparkdl.compat.libc`: glibc's ``malloc_trim`` through ``ctypes`` (a no-op on
  other C libraries).

:mod:`sparkdl.server.web.transport` subclasses cheroot's public connection, stream and
gateway classes and reaches their buffers only through :mod:`sparkdl.compat.cheroot`.

Each has a shape test under ``tests/`` (``tests/unit/test_compat_shapes.py`` and, for
what needs a SparkSession, ``tests/integration/test_compat_spark.py``) that fails with a
clear message, naming the dependency's version and the module to update, when the
dependency changes shape. ``tests/unit/test_package.py`` fails when code outside this
package reaches a dependency's internals.
"""

from __future__ import annotations

__all__: list[str] = []
