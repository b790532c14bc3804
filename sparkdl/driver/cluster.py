"""What the driver asks the cluster: task slots, the workers a fit gets, the service host.

Example:
    >>> parse_local_master("local[4]"), parse_local_master("yarn")
    (True, False)
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from sparkdl.compat.sessions import ConnectTools
from sparkdl.compat.spark import task_slots
from sparkdl.config import TrainConfig
from sparkdl.contract.plan import DEFAULT_CACHE_BUDGET
from sparkdl.errors import ClusterError
from sparkdl.sync.modes import mode_class

if TYPE_CHECKING:
    from sparkdl.compat.sessions import SessionTools

__all__ = [
    "DEFAULT_CACHE_BUDGET",
    "cache_budget",
    "num_workers",
    "parse_local_master",
    "service_host",
    "task_cpus",
    "task_slots",
]


def parse_local_master(master: str) -> bool:
    """Whether executors run on the driver's machine (``local``, ``local-cluster``)."""
    return master.startswith("local")


def runs_in_driver_jvm(master: str) -> bool:
    """Whether the executor is the driver's own JVM (``local`` and ``local[...]``, not
    ``local-cluster``): its Python workers share the driver's terminal, and Spark starts
    no executors to wait for.

    Example:
        >>> runs_in_driver_jvm("local[2,4]"), runs_in_driver_jvm("local-cluster[2,1,1024]")
        (True, False)
    """
    return re.fullmatch(r"local(\[.*\])?", master) is not None


def num_workers(
    tools: SessionTools, config: TrainConfig, *, hosted: bool = False, relay: bool = False
) -> int:
    """The fit's workers; checks the slots a barrier stage needs (waits for executors on
    real clusters).

    Modes without a barrier run ordinary tasks, which Spark queues when there are more
    than slots, so a given ``num_workers`` needs no check; the default is one per slot.
    A service in the cluster (``hosted``) always runs a barrier stage, and its relay
    (``relay``: callbacks, checkpoints or progress to follow) needs one slot more for
    its polls, so the default then leaves one slot free.

    Raises:
        ClusterError: A barrier stage would need more slots than the cluster has.
    """
    barrier = mode_class(config.mode).barrier or hosted
    if not barrier and config.num_workers:
        return config.num_workers
    master = tools.master
    spare = 1 if relay else 0
    wait_until = time.monotonic() + (0 if runs_in_driver_jvm(master) else config.slot_wait_timeout)
    while True:
        slots = tools.slots()
        wanted = config.num_workers or slots - spare
        if slots >= wanted + spare and wanted > 0:
            return wanted
        if time.monotonic() >= wait_until:
            if spare and slots >= max(wanted, 1):
                raise ClusterError(
                    f"{max(wanted, 1)} worker(s) take all {slots} task slot(s) (master "
                    f"{master!r}), but with the parameter service in the cluster the "
                    "driver follows the fit (callbacks, checkpoints, progress) through "
                    "small Spark jobs that need one free slot. Pass a smaller "
                    "num_workers=, add a slot, or use service_placement='driver' (the "
                    "client must then be reachable from the executors)."
                )
            raise ClusterError(
                f"mode={config.mode!r} runs num_workers={wanted} tasks at once as a barrier "
                f"stage, but the cluster has {slots} task slot(s) (master {master!r}). Lower "
                "num_workers, add executors or cores, or raise slot_wait_timeout= if "
                "executors are still starting."
            )
        time.sleep(0.5)


def service_host(tools: SessionTools) -> str:
    """The address executors reach this process at: loopback for local masters; on
    Spark Connect the client's address on the route to the server."""
    if isinstance(tools, ConnectTools):
        return tools.client_host()
    if parse_local_master(tools.master):
        return "127.0.0.1"
    return tools.spark.conf.get("spark.driver.host", "127.0.0.1") or "127.0.0.1"


def task_cpus(tools: SessionTools) -> int:
    """``spark.task.cpus``: the cores each task may use."""
    try:
        return max(1, int(tools.conf("spark.task.cpus", "1") or 1))
    except ValueError:
        return 1


def cache_budget(tools: SessionTools) -> int:
    """Bytes of its partition a worker keeps in memory under ``data_cache="auto"``.

    When ``spark.executor.pyspark.memory`` caps the Python workers, half of each
    worker's share of it (Spark gives every Python worker the cap divided by
    ``spark.executor.cores``; the other half is for TensorFlow, the model and the
    batches in flight); else :data:`DEFAULT_CACHE_BUDGET` (1 GiB), a share that fits
    next to TensorFlow in an executor's default memory overhead on most clusters and
    is small against a workstation's memory in local mode. A task's training and
    validation rows share it.

    Example:
        >>> _memory_bytes("2g"), _memory_bytes("512m"), _memory_bytes("100")
        (2147483648, 536870912, 104857600)
    """
    cap = tools.conf("spark.executor.pyspark.memory")
    if not cap:
        return DEFAULT_CACHE_BUDGET
    try:
        cores = max(1, int(tools.conf("spark.executor.cores", "1") or 1))
    except ValueError:
        cores = 1
    return max(1 << 20, _memory_bytes(cap) // (2 * cores))


def _memory_bytes(text: str) -> int:
    """Spark's memory strings ("2g", "512m"; a bare number is MiB) in bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)b?\s*", text.lower())
    if not match:
        return DEFAULT_CACHE_BUDGET
    number, unit = int(match.group(1)), match.group(2) or "m"
    return number << {"k": 10, "m": 20, "g": 30, "t": 40}[unit]
