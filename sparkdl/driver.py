"""One fit on the driver: check, start the service, run the training job, collect.

Example:
    >>> parse_local_master("local[4]"), parse_local_master("yarn")
    (True, False)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import cloudpickle
import numpy as np
from pyspark.sql import DataFrame, SparkSession

from sparkdl import checkpoints, data, keras_io
from sparkdl.callbacks import DriverCallbacks
from sparkdl.config import TrainConfig
from sparkdl.errors import ClusterError, ConfigError, SparkDLError, WorkerError
from sparkdl.progress import Progress
from sparkdl.server.rules import make_rule
from sparkdl.server.service import ParameterService
from sparkdl.server.store import WeightStore
from sparkdl.spark_ui import EpochMarks
from sparkdl.worker import RESULT_SCHEMA, WorkerPayload, make_train_function

if TYPE_CHECKING:
    import keras
    from pyspark import SparkContext

__all__ = ["FitResult", "parse_local_master", "prepare", "run_fit", "task_slots"]

_log = logging.getLogger(__name__)


@dataclass
class FitResult:
    """What one fit produced.

    Attributes:
        weights: Final center weights.
        model_bytes: The trained model as a ``.keras`` archive.
        history: Per-epoch logs averaged over workers.
        reports: One dict per worker (rows, seconds, communication time...).
        rows: Rows trained on per epoch.
        seconds: Wall seconds of the fit on the driver.
        input_shapes: Per-sample shape of every input the model was fed.
        status: The service's final status.
        job_group: The Spark job group of the fit (its jobs in the Spark UI).
    """

    weights: list[np.ndarray]
    model_bytes: bytes
    history: dict[str, list[float]]
    reports: list[dict[str, Any]]
    rows: int
    seconds: float
    input_shapes: tuple[tuple[int, ...], ...]
    status: dict[str, Any] = field(default_factory=dict)
    job_group: str = ""

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Per-sample shape of the first input."""
        return self.input_shapes[0]

    @property
    def communication_share(self) -> float:
        """Fraction of worker training time spent in calls to the service."""
        train = sum(r["train_seconds"] for r in self.reports)
        comm = sum(r["comm_seconds"] for r in self.reports)
        return comm / train if train > 0 else 0.0


@dataclass(frozen=True)
class Prepared:
    """The validated input of a fit: one prepared column per model input and output."""

    frame: DataFrame
    summary: data.DataSummary
    label_kinds: tuple[str, ...]
    input_shapes: tuple[tuple[int, ...], ...]

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Per-sample shape of the first input."""
        return self.input_shapes[0]

    @property
    def label_kind(self) -> str:
        """Label kind of the first output."""
        return self.label_kinds[0]


def prepare(
    df: DataFrame,
    model: keras.Model,
    features_col: Any,
    label_col: Any,
    *,
    validate: bool = True,
) -> Prepared:
    """Checks the model and the data and selects the prepared columns.

    A model with several inputs takes ``features_col`` as a list (one column per input,
    in order) or a dict from input name to column; ``label_col`` likewise for several
    outputs.

    Runs one Spark job (an aggregate) to count rows and find nulls, NaNs and ragged rows;
    ``validate=False`` skips its look at every value for NaNs.

    Raises:
        SchemaError: A column is missing or has a wrong type, or the data is bad.
        ModelError: The model is not compiled, or its input does not fit the features.
    """
    keras_io.check_compiled(model)
    if not isinstance(df, DataFrame):
        raise data.ColumnTypeError(
            f"Expected a pyspark.sql.DataFrame. Received: {type(df).__name__}"
        )
    features = data.feature_columns(df, features_col, keras_io.input_names(model))
    labels = data.label_columns(df, label_col, keras_io.output_names(model))
    frame = df.select(
        *[f.alias(data.feature_name(i)) for i, f in enumerate(features)],
        *[y.alias(data.label_name(j)) for j, (y, _) in enumerate(labels)],
    )
    kinds = tuple(kind for _, kind in labels)
    summary = data.summarize(frame, kinds, len(features), scan_values=validate)
    shapes = tuple(
        keras_io.resolve_input_shape(model, width, i) for i, width in enumerate(summary.widths)
    )
    for j, kind in enumerate(kinds):
        keras_io.check_labels(
            model,
            kind,
            summary.label_widths[j],
            summary.label_mins[j],
            summary.label_maxs[j],
            index=j,
        )
    return Prepared(frame, summary, kinds, shapes)


def run_fit(
    prepared: Prepared,
    model: keras.Model,
    config: TrainConfig,
    *,
    custom_objects: dict[str, Any] | None = None,
    validation: Prepared | None = None,
    callbacks: Sequence[Any] | None = None,
    initial_epoch: int = 0,
    history: dict[str, list[float]] | None = None,
) -> FitResult:
    """Trains ``model`` on ``prepared`` data as ``config`` says.

    ``validation`` (prepared like the training data) is collected to the driver and
    broadcast; worker i reports ``val_*`` logs on rows ``i::num_workers`` every epoch.
    ``callbacks`` run on the driver (:class:`sparkdl.callbacks.DriverCallbacks`), and
    so do checkpoints. A resumed fit passes the epochs done as ``initial_epoch`` and
    their logs as ``history``.

    Raises:
        ClusterError: The cluster has fewer task slots than ``num_workers``.
        WorkerError: A worker failed; carries each failed worker's traceback.
    """
    started = time.perf_counter()
    spark = prepared.frame.sparkSession
    sc = spark.sparkContext
    num_workers = _num_workers(sc, config)
    if config.backup_workers >= num_workers:
        raise ConfigError(
            f"backup_workers={config.backup_workers} must be smaller than the number of "
            f"workers ({num_workers}): a round needs at least one worker."
        )
    model_bytes = keras_io.model_to_bytes(model)
    store = WeightStore(
        model.get_weights(),
        num_workers=num_workers,
        rule=make_rule(str(config.merge), staleness=config.staleness, num_workers=num_workers),
        mode=config.mode,
        round_timeout=config.round_timeout,
        history=history,
        backup_workers=config.backup_workers,
        epochs=config.epochs,
        # Driver callbacks see each synchronous epoch before the workers go on.
        gate_epochs=bool(callbacks or config.checkpoint_dir),
    )
    service = ParameterService(store, host=_service_host(spark, config), port=config.port)
    broadcast = sc.broadcast(model_bytes)
    held_out = None
    if validation is not None:
        arrays = data.to_numpy_multi(
            validation.frame.toArrow().to_batches(), prepared.input_shapes, prepared.label_kinds
        )
        held_out = sc.broadcast(arrays)
    payload = WorkerPayload(
        model_bytes=broadcast,
        custom_objects=cloudpickle.dumps(custom_objects) if custom_objects else None,
        url="",
        token=service.token,
        input_shapes=list(prepared.input_shapes),
        label_kinds=list(prepared.label_kinds),
        epochs=config.epochs,
        batch_size=config.batch_size,
        sync_every=config.sync_every,
        shuffle=config.shuffle,
        seed=config.seed,
        threads=config.threads_per_worker or _task_cpus(sc),
        request_timeout=config.request_timeout,
        request_retries=config.request_retries,
        mode=config.mode,
        merge=str(config.merge),
        elastic_alpha=config.alpha_for(num_workers),
        delta_scale=config.delta_scale,
        validation_split=config.validation_split,
        validation=held_out,
        num_workers=num_workers,
        initial_epoch=initial_epoch,
        mixed_precision=config.mixed_precision,
        overlap=config.overlaps,
    )
    frame = prepared.frame
    if frame.rdd.getNumPartitions() != num_workers:
        frame = frame.repartition(num_workers)
    train_rows = prepared.summary.rows
    if config.validation_split and validation is None:  # each worker holds out its tail
        train_rows = math.floor(train_rows * (1 - config.validation_split))
    progress = (
        Progress(store, epochs=config.epochs, rows=train_rows, verbose=config.verbose)
        if config.verbose
        else None
    )
    downpour = config.mode != "synchronous" and config.merge == "delta"
    if downpour and config.frequency == "epoch" and num_workers > 1 and config.delta_scale == 1:
        _log.warning(
            "merge='delta' with delta_scale=1 adds each worker's whole-epoch delta in full, "
            "so the center moves about num_workers=%d times as far per epoch as one worker "
            "would, and may oscillate. The default delta_scale (None) divides whole-epoch "
            "deltas by num_workers.",
            num_workers,
        )
    driver_callbacks = list(callbacks or [])
    if config.checkpoint_dir:
        driver_callbacks.append(
            checkpoints.checkpoint_callback(
                config.checkpoint_dir, config.checkpoint_keep, config.to_dict(), history or {}
            )
        )
    runner = (
        DriverCallbacks(
            driver_callbacks, model_bytes, custom_objects, store, config.epochs, initial_epoch
        )
        if driver_callbacks
        else None
    )
    fit_name = (
        f"sparkdl fit: {config.mode}/{config.merge}, {num_workers} workers, "
        f"{config.epochs} epochs, {train_rows} rows"
    )
    group = f"sparkdl-fit-{store.started:.0f}-{id(store):x}"
    # A fatal worker error (or a raising driver callback) aborts the store: cancel the
    # job then, rather than let Spark retry tasks that can only fail again.
    job_over = threading.Event()
    canceller = threading.Thread(
        target=_cancel_on_abort,
        args=(sc, store, group, job_over),
        name="sparkdl-cancel",
        daemon=True,
    )
    marks = EpochMarks(sc, store, group, fit_name, config.epochs, initial_epoch)
    # The fitted model is rebuilt while the workers train (it costs about 0.2 s on
    # the digits MLP), or is the callbacks' master model, which already exists.
    result_model = _build_in_background(model_bytes, custom_objects) if runner is None else None
    service.start()
    try:
        payload = _with_url(payload, service.url)
        sc.setJobGroup(group, fit_name)
        sc.setJobDescription(fit_name)
        canceller.start()
        marks.start()  # one described empty job per closed epoch, in the Spark UI
        if progress:
            progress.start()
        if runner:
            runner.start()
        try:
            if config.mode == "synchronous":
                rows = _run_barrier_job(frame, payload, num_workers)
            else:  # ordinary tasks: none waits for another, Spark may queue them
                rows = frame.mapInArrow(make_train_function(payload), RESULT_SCHEMA).collect()
        except Exception as exc:
            if runner:
                runner.abandon()
                if runner.error is not None:  # a callback stopped the fit by raising
                    raise runner.error from None
            raise _worker_error(exc, store.failures()) from None
        reports = sorted((json.loads(r["report"]) for r in rows), key=lambda r: r["worker"])
        weights = runner.finish() if runner else store.weights()
        history = store.history()
        status = store.status()
    finally:
        if progress:
            progress.stop()
        job_over.set()
        marks.stop()
        service.stop()
        sc.setJobDescription(None)  # type: ignore[arg-type]
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        broadcast.unpersist(blocking=False)
        if held_out is not None:
            held_out.unpersist(blocking=False)
    if runner is not None:
        trained = runner.master
    else:
        assert result_model is not None
        trained = result_model.result()
    trained.set_weights(weights)
    return FitResult(
        weights=weights,
        model_bytes=keras_io.model_to_bytes(trained),
        history=history,
        reports=reports,
        rows=prepared.summary.rows,
        seconds=time.perf_counter() - started,
        input_shapes=prepared.input_shapes,
        status=status,
        job_group=group,
    )


def _build_in_background(
    model_bytes: bytes, custom_objects: dict[str, Any] | None
) -> Future[keras.Model]:
    """Rebuilds the model from its bytes in a daemon thread; the future holds it."""
    future: Future[keras.Model] = Future()

    def build() -> None:
        try:
            future.set_result(keras_io.model_from_bytes(model_bytes, custom_objects))
        except BaseException as exc:  # the caller sees it at .result()
            future.set_exception(exc)

    threading.Thread(target=build, name="sparkdl-result-model", daemon=True).start()
    return future


def _run_barrier_job(frame: DataFrame, payload: WorkerPayload, num_workers: int) -> list[Any]:
    """Runs the barrier stage so that Spark retries it when a worker is lost.

    Spark never retries a failed barrier *result* stage ("Could not recover from a
    failed barrier ResultStage"), but it does retry a barrier stage whose output feeds
    a shuffle, up to ``spark.stage.maxConsecutiveAttempts`` times; the workers of the
    new attempt rejoin the service at the last completed round. Hence the
    ``repartition(1)`` of the workers' one-row reports.

    Spark also refuses a barrier stage over a chain whose ancestors have another
    partition count (``union``, ``coalesce``...). That check fails at submission,
    before any task runs, so retrying over ``repartition(num_workers)`` loses nothing.
    """
    train = make_train_function(payload)
    try:
        return frame.mapInArrow(train, RESULT_SCHEMA, barrier=True).repartition(1).collect()
    except Exception as exc:
        if "BarrierJobUnsupportedRDDChain" not in str(exc):
            raise
    _log.info("barrier stage needs a shuffle for this DataFrame; repartitioning")
    frame = frame.repartition(num_workers)
    return frame.mapInArrow(train, RESULT_SCHEMA, barrier=True).repartition(1).collect()


def _cancel_on_abort(
    sc: SparkContext, store: WeightStore, group: str, job_over: threading.Event
) -> None:
    """Cancels the fit's Spark jobs once the store is aborted, until the job is over."""
    while not job_over.is_set():
        if store.aborted_event.wait(0.2):
            if not job_over.is_set():
                sc.cancelJobGroup(group)
            return


def parse_local_master(master: str) -> bool:
    """Whether executors run on the driver's machine (``local``, ``local-cluster``)."""
    return master.startswith("local")


def task_slots(sc: SparkContext) -> int:
    """Number of tasks the cluster can run at once with the default resource profile."""
    try:
        jsc = sc._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:
        return int(sc.defaultParallelism)


def _num_workers(sc: SparkContext, config: TrainConfig) -> int:
    """Checks the slots a barrier stage needs; waits for executors on real clusters.

    Asynchronous modes run ordinary tasks, which Spark queues when there are more than
    slots, so a given ``num_workers`` needs no check; the default is one per slot.
    """
    if config.mode != "synchronous" and config.num_workers:
        return config.num_workers
    master = str(sc.master)
    wait_until = time.monotonic() + (
        0 if re.fullmatch(r"local(\[.*\])?", master) else config.slot_wait_timeout
    )
    while True:
        slots = task_slots(sc)
        wanted = config.num_workers or slots
        if slots >= wanted > 0:
            return wanted
        if time.monotonic() >= wait_until:
            raise ClusterError(
                f"Synchronous mode runs num_workers={wanted} tasks at once as a barrier stage, "
                f"but the cluster has {slots} task slot(s) (master {master!r}). Lower "
                "num_workers, add executors or cores, or raise slot_wait_timeout= if "
                "executors are still starting."
            )
        time.sleep(0.5)


def _service_host(spark: SparkSession, config: TrainConfig) -> str:
    if config.service_host:
        return config.service_host
    if parse_local_master(str(spark.sparkContext.master)):
        return "127.0.0.1"
    return spark.conf.get("spark.driver.host", "127.0.0.1") or "127.0.0.1"


def _task_cpus(sc: SparkContext) -> int:
    try:
        return max(1, int(sc.getConf().get("spark.task.cpus", "1") or 1))
    except ValueError:
        return 1


def _with_url(payload: WorkerPayload, url: str) -> WorkerPayload:
    return dataclasses.replace(payload, url=url)


def _worker_error(exc: Exception, failures: dict[int, str]) -> SparkDLError:
    text = str(exc)
    ran_out = _retries_ran_out(text)
    if failures and ran_out is None:  # a fatal error a worker reported
        first = next(iter(failures.values())).strip().splitlines()[-1]
        return WorkerError(f"{len(failures)} worker(s) failed during training: {first}", failures)
    match = re.search(
        r"Traceback \(most recent call last\):.*?(?=\n\tat |\n\s*at org\.|\Z)", text, re.S
    )
    if match:
        trace = match.group(0)
        last = trace.strip().splitlines()[-1]
    else:
        lines = [
            ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("\tat ")
        ]
        trace = "\n".join(lines[:6]) or type(exc).__name__
        causes = [ln for ln in lines if re.search(r"^:?\s*[\w.$]+(Exception|Error)\b", ln)]
        crashed = [ln for ln in lines if "Python worker exited unexpectedly" in ln]
        last = (crashed or causes or lines or [type(exc).__name__])[0].lstrip(": ")
        last = re.sub(r"^.*?(?=Python worker exited)", "", last)
    if "ModuleNotFoundError" in last:
        last += (
            ". Spark's Python workers run another Python than the driver's; set the "
            "environment variable PYSPARK_PYTHON (or spark.pyspark.python) to a Python "
            "that has sparkdl installed before the SparkSession starts"
        )
    if ran_out is not None:
        worker, times, setting = ran_out
        traces = dict(failures)
        traces.setdefault(worker, trace)
        return WorkerError(
            f"Worker {worker} failed {times} times, the last time with: {last}. Spark's "
            f"retries ran out ({setting}); each retry rejoined where training stood, so "
            "the failure repeats. Check the executor logs for what kills the process "
            "(memory limits, pre-emption) or raise the retry setting.",
            traces,
        )
    return WorkerError(f"The training job failed: {last}", {-1: trace})


def _retries_ran_out(text: str) -> tuple[int, int, str] | None:
    """``(worker, attempts, the setting)`` when Spark gave up retrying a task or stage.

    Example:
        >>> _retries_ran_out("Task 1 in stage 4.0 failed 4 times, most recent failure")
        (1, 4, 'spark.task.maxFailures')
    """
    task = re.search(r"Task (\d+) in stage [\d.]+ failed (\d+) times", text)
    if task:
        return int(task.group(1)), int(task.group(2)), "spark.task.maxFailures"
    stage = re.search(r"has failed the maximum allowable number of times: (\d+)", text)
    if stage:
        barrier = re.search(r"barrier task \w+\(\d+, (\d+)\)", text)
        worker = int(barrier.group(1)) if barrier else -1
        return worker, int(stage.group(1)), "spark.stage.maxConsecutiveAttempts"
    return None
