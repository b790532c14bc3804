"""The places where sparkdl relies on a dependency's private internals.

Each module here is the only place sparkdl touches one dependency's private internals
(attributes and methods with a leading underscore, Py4J handles on JVM objects, the text
of another library's error messages), so that an upgrade of that dependency breaks one
known module rather than code spread over the package:

* :mod:`sparkdl.compat.spark`: PySpark's ``SparkContext._jsc`` / ``_jvm`` handles and
  the text of Spark's job-failure exceptions.
* :mod:`sparkdl.compat.http_client`: ``http.client.HTTPConnection._send_output`` and
  its ``_buffer`` of header lines.
* :mod:`sparkdl.server.transport` (kept next to the service it serves): cheroot's
  connection, socket reader / writer and WSGI gateway classes.

Each has a shape test under ``tests/`` (``tests/unit/test_compat_shapes.py`` and
``tests/integration/test_compat_spark.py``) that fails with a clear message, naming the
dependency's version and the module to update, when the dependency changes shape.
"""

from __future__ import annotations

__all__: list[str] = []
