"""What a fit's driver side asks of its SparkSession, for classic and Spark Connect.

A classic session has a ``SparkContext``: job groups, broadcasts, the task slots of
the registered executors (:mod:`sparkdl.compat.spark`) and the driver's SparkConf. A
Spark Connect session (``SparkSession.builder.remote(...)``, Databricks serverless and
standard-access clusters) has none of them: the user's process is a client of a
driver that lives in the cluster. :func:`session_tools` gives the one interface the
rest of sparkdl uses, answered by each kind of session with what it has:

============================  ===========================  ============================
need                          classic                      Spark Connect
============================  ===========================  ============================
a setting                     the SparkConf                ``spark.conf`` (the server's)
task slots                    ``maxNumConcurrentTasks``    the master, else the
                                                           default parallelism of a
                                                           ``range`` (one small job)
the fit's jobs, cancelled     job group                    job tag, ``interruptTag``
bytes every task needs        broadcast                    in the task's closure
a frame's partitions          ``rdd.getNumPartitions``     unknown (``None``)
Spark UI marks, attempts      yes                          no (no ``SparkContext``)
============================  ===========================  ============================

The module only uses public PySpark API except :meth:`ConnectTools.client_host`, which
reads the Connect client's ``host`` (the server's name, public on the client object
but not on the session).

Example:
    >>> Inline(b"abc").value
    b'abc'
"""

from __future__ import annotations

import contextlib
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkdl.compat.spark import quiet_task_failures, task_slots

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "ClassicTools",
    "ConnectTools",
    "Inline",
    "SessionTools",
    "is_connect",
    "session_tools",
]

#: Rows of the ``range`` whose partitions tell a Connect session's default parallelism.
_PROBE_ROWS = 1 << 20
#: Seconds a probed parallelism is reused (executors come and go on a cluster).
_PROBE_SECONDS = 30.0
_probed: dict[str, tuple[int, float]] = {}


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session, by its class. (PySpark itself
    decides by the process's environment, so one process runs sessions of one kind.)

    Example:
        >>> is_connect(object())
        False
    """
    return type(spark).__module__.startswith("pyspark.sql.connect")


def session_tools(spark: SparkSession) -> SessionTools:
    """The :class:`SessionTools` of ``spark``'s kind.

    Raises:
        ConfigError: A Spark Connect session of PySpark before 4.0.
    """
    if not is_connect(spark):
        return ClassicTools(spark)
    from sparkdl.compat.spark_versions import spark_version
    from sparkdl.errors import ConfigError

    if spark_version() < (4, 0):
        raise ConfigError(
            "sparkdl trains over Spark Connect with PySpark 4.0 or later on the client. "
            "Received: a Spark Connect session of PySpark "
            f"{'.'.join(map(str, spark_version()))}. Upgrade the client "
            '(pip install -U "pyspark[connect]>=4.0", the extra "sparkdl-keras[connect]") or '
            "use a classic session."
        )
    return ConnectTools(spark)


@dataclass(frozen=True)
class Inline:
    """Bytes carried in a task's closure where a session has no broadcast: the same
    ``.value`` as a broadcast's."""

    value: Any


class SessionTools:
    """What the driver side of a fit, a scoring or a warm-up asks of the session.

    Args:
        spark: The session.
    """

    #: Whether this is a Spark Connect session.
    connect = False

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    @property
    def master(self) -> str:
        """``spark.master`` (``""`` when the session does not say)."""
        return str(self.conf("spark.master") or "")

    def conf(self, key: str, default: str | None = None) -> str | None:
        """A Spark setting of the session (``default`` when unset)."""
        raise NotImplementedError

    def slots(self) -> int:
        """Tasks the cluster runs at once now."""
        raise NotImplementedError

    def parallelism(self) -> int:
        """The default parallelism (how many Python workers a warm-up warms)."""
        return self.slots()

    def key(self) -> str:
        """Names the session's driver (one warm-up handle each)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def jobs_named(self, group: str, description: str) -> Iterator[None]:
        """In the calling thread, the Spark jobs started inside run under ``group``
        (what :meth:`cancel` stops) and, where the session can, ``description``."""
        raise NotImplementedError
        yield  # pragma: no cover

    def cancel(self, group: str) -> None:
        """Cancels the jobs running under ``group``."""
        raise NotImplementedError

    def describe(self, description: str) -> None:
        """Describes the calling thread's next Spark jobs in the Spark UI, where the
        session can (classic: a local property; Connect has none)."""

    @contextlib.contextmanager
    def shared(self, value: Any) -> Iterator[Any]:
        """``value`` for every task, as an object with ``.value``; released on exit."""
        yield Inline(value)

    def num_partitions(self, frame: DataFrame) -> int | None:
        """``frame``'s partitions, or ``None`` where the session cannot tell."""
        return None

    def spark_context(self) -> Any | None:
        """The ``SparkContext``, or ``None`` (Spark Connect)."""
        return None

    @contextlib.contextmanager
    def quiet_task_failures(self) -> Iterator[None]:
        """Inside, a failed task's Java stack trace is not logged on the driver, where
        the session can (classic: :func:`sparkdl.compat.spark.quiet_task_failures`; a
        Connect server logs in its own process)."""
        yield


class ClassicTools(SessionTools):
    """A classic session: its ``SparkContext`` answers."""

    def __init__(self, spark: SparkSession) -> None:
        super().__init__(spark)
        self.sc = spark.sparkContext

    @property
    def master(self) -> str:
        return str(self.sc.master)

    def conf(self, key: str, default: str | None = None) -> str | None:
        value = self.sc.getConf().get(key, default)
        return None if value is None else str(value)

    def slots(self) -> int:
        return task_slots(self.sc)

    def parallelism(self) -> int:
        return int(self.sc.defaultParallelism)

    def key(self) -> str:
        return str(self.sc.applicationId)

    @contextlib.contextmanager
    def jobs_named(self, group: str, description: str) -> Iterator[None]:
        self.sc.setJobGroup(group, description)
        self.sc.setJobDescription(description)
        yield

    def cancel(self, group: str) -> None:
        self.sc.cancelJobGroup(group)

    @contextlib.contextmanager
    def quiet_task_failures(self) -> Iterator[None]:
        with quiet_task_failures(self.sc):
            yield

    def describe(self, description: str) -> None:
        self.sc.setLocalProperty("spark.job.description", description)

    @contextlib.contextmanager
    def shared(self, value: Any) -> Iterator[Any]:
        broadcast = self.sc.broadcast(value)
        try:
            yield broadcast
        finally:
            broadcast.unpersist(blocking=False)

    def num_partitions(self, frame: DataFrame) -> int | None:
        return int(frame.rdd.getNumPartitions())

    def spark_context(self) -> Any | None:
        return self.sc


class ConnectTools(SessionTools):
    """A Spark Connect session: the server's settings and the job tags of the client."""

    connect = True

    def conf(self, key: str, default: str | None = None) -> str | None:
        try:
            value = self.spark.conf.get(key, default)
        except Exception:  # a setting the server refuses to show
            return default
        return None if value is None else str(value)

    def slots(self) -> int:
        """From a ``local[N]`` / ``local-cluster[n,c,m]`` master, else the default
        parallelism (the executors' cores) of a ``range`` over the task's cores."""
        cores = _local_cores(self.master)
        if cores is None:
            cores = self._probed_cores()
        try:
            task_cpus = max(1, int(self.conf("spark.task.cpus", "1") or 1))
        except ValueError:
            task_cpus = 1
        return max(1, cores // task_cpus)

    def _probed_cores(self) -> int:
        """The default parallelism of a ``range`` (one small job), remembered for
        :data:`_PROBE_SECONDS` per session: a fit and its warm-up ask once."""
        import time

        from pyspark.sql import functions as F

        key, now = self.key(), time.monotonic()
        known = _probed.get(key)
        if known is not None and now - known[1] < _PROBE_SECONDS:
            return known[0]
        probe = self.spark.range(_PROBE_ROWS).select(F.spark_partition_id().alias("p"))
        cores = int(probe.agg(F.max("p")).collect()[0][0]) + 1
        _probed[key] = (cores, now)
        return cores

    def key(self) -> str:
        spark: Any = self.spark  # a Connect session (not the classic type mypy sees)
        return f"connect:{spark.session_id}"

    @contextlib.contextmanager
    def jobs_named(self, group: str, description: str) -> Iterator[None]:
        self.spark.addTag(group)  # this thread's operations only
        try:
            yield
        finally:
            self.spark.removeTag(group)

    def cancel(self, group: str) -> None:
        self.spark.interruptTag(group)

    def client_host(self) -> str:
        """The address executors most likely reach this client at.

        A client on the Connect server's machine: loopback for a local master, else
        the driver's address (``spark.driver.host``: the client runs on the driver
        node, as a notebook on a Databricks standard-access cluster). Any other client:
        its local address on the route to the server. Loopback when none is found.
        """
        spark: Any = self.spark
        server = str(getattr(spark.client, "host", "") or "localhost").strip("[]")
        if server in ("localhost", "::1") or server.startswith("127."):
            if self.master.startswith("local"):
                return "127.0.0.1"
            return self.conf("spark.driver.host") or "127.0.0.1"
        try:
            family, kind, _, _, address = socket.getaddrinfo(server, 9, type=socket.SOCK_DGRAM)[0]
            with socket.socket(family, kind) as probe:
                probe.connect(address)  # UDP: picks a route, sends nothing
                return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def _local_cores(master: str) -> int | None:
    """Executor cores of a local master whose count it names (``None`` for any other,
    ``local[*]`` included: the server's cores, not this client's).

    Example:
        >>> _local_cores("local[3]"), _local_cores("local-cluster[2,1,1024]"), _local_cores("yarn")
        (3, 2, None)
    """
    if master == "local":
        return 1
    found = re.fullmatch(r"local\[(\d+)(,\d+)?\]", master)
    if found:
        return int(found.group(1))
    found = re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*\d+\]", master)
    if found:
        return int(found.group(1)) * int(found.group(2))
    return None
