"""One fit on the driver: resolve the plan, serve the weights, run the training job.

:class:`Fit` reads top to bottom as what happens: the settings and the cluster's facts
are resolved into a :class:`~sparkdl.contract.plan.FitPlan`; the service, the broadcasts, the
Spark UI marks, the job canceller, the progress bar and the
driver's callbacks are each entered into one :class:`contextlib.ExitStack`, so each is
torn down, in reverse order, however the job ends (Ctrl-C included:
:mod:`sparkdl.driver.interrupt`); then one Spark job trains in the fit's job group, on a driver
thread, and the workers' reports and the service's state become a :class:`FitResult`.

Example:
    >>> FitResult.__dataclass_fields__["history"].type
    'dict[str, list[float]]'
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkdl.compat.sessions import SessionTools, session_tools
from sparkdl.compat.spark import failure_summary, is_unsupported_barrier_chain, retries_ran_out
from sparkdl.config import TrainConfig
from sparkdl.contract import custom_objects, keras_io
from sparkdl.contract.metric_states import MetricStates
from sparkdl.contract.payload import (
    RESULT_SCHEMA,
    VALIDATION,
    Hosting,
    WorkerPayload,
    service_result,
    train_function,
)
from sparkdl.contract.plan import FitPlan, format_resolved
from sparkdl.contract.reports import SERVICE_KEYS, FitReport, WorkerReport
from sparkdl.driver import cluster, data
from sparkdl.driver.background import Background
from sparkdl.driver.callbacks import DriverCallbacks
from sparkdl.driver.interrupt import interrupt_raises, run_job
from sparkdl.driver.progress import Progress
from sparkdl.driver.relay import Relay
from sparkdl.driver.spark_ui import EpochMarks
from sparkdl.driver.warmup import tensorflow_logs
from sparkdl.errors import ConfigError, SparkDLError, WorkerError
from sparkdl.protocol import wire
from sparkdl.server.state import checkpoints
from sparkdl.server.state.events import FitEvents
from sparkdl.server.state.sharded import ShardedStore
from sparkdl.server.state.store import WeightStore
from sparkdl.server.web.attempts import SparkAttempts
from sparkdl.server.web.relay import relay_digest
from sparkdl.server.web.service import ParameterService
from sparkdl.server.web.tls import Certificate
from sparkdl.sync.shards import ShardLayout, split_outer

if TYPE_CHECKING:
    import keras

__all__ = ["Fit", "FitResult"]

_log = logging.getLogger(__name__)

#: Seconds a fit waits, as it ends, for a cancel of its jobs still in flight.
CANCEL_JOIN_SECONDS = 10.0


@dataclass
class FitResult:
    """What one fit produced.

    Attributes:
        weights: Final center weights.
        model_bytes: The trained model as a ``.keras`` archive.
        history: Per-epoch logs over all workers (metrics merged from their states).
        report: Figures of the fit (seconds, per-worker reports, service status).
        input_shapes: Per-sample shape of every input the model was fed.
    """

    weights: list[np.ndarray]
    model_bytes: bytes
    history: dict[str, list[float]]
    report: FitReport
    input_shapes: tuple[tuple[int, ...], ...]


class Fit:
    """Trains ``model`` on ``prepared`` data as ``config`` says.

    Args:
        prepared: The training data (:func:`sparkdl.driver.data.prepare`).
        model: The compiled model (not modified).
        config: The user's settings.
        custom_objects: Custom layers and losses, shipped with cloudpickle.
        validation: Validation data prepared like the training data; its rows travel
            with the training rows (marked), each worker caches its share apart and
            reports ``val_*`` logs on it every epoch.
        callbacks: Keras callbacks run on the driver
            (:class:`sparkdl.driver.callbacks.DriverCallbacks`); checkpoints run there too.
        initial_epoch: Epochs done before (a resumed fit).
        history: Their logs (a resumed fit).
    """

    def __init__(
        self,
        prepared: data.Prepared,
        model: keras.Model,
        config: TrainConfig,
        *,
        custom_objects: dict[str, Any] | None = None,
        validation: data.Prepared | None = None,
        callbacks: Sequence[Any] | None = None,
        initial_epoch: int = 0,
        history: dict[str, list[float]] | None = None,
        outer_state: tuple[list[np.ndarray], int] | None = None,
    ) -> None:
        self.prepared = prepared
        self.model = model
        self.config = config
        self.custom_objects = custom_objects
        self.validation = validation
        self.callbacks = list(callbacks or [])
        self.initial_epoch = initial_epoch
        self.history = history
        #: The outer optimizer's state from the checkpoint a fit resumes from.
        self.outer_state = outer_state
        #: The models the fit builds in daemon threads while the workers train.
        self._background = Background()

    def run(self) -> FitResult:
        """Runs the fit; returns or raises once its background builds ended.

        The threads that rebuild the model while the workers train end first
        (:mod:`sparkdl.driver.background`): a script that exits after a failed fit would
        otherwise crash or hang.

        Raises:
            ClusterError: The cluster has fewer task slots than a barrier stage needs.
            WorkerError: A worker failed; carries each failed worker's traceback.
            KeyboardInterrupt: Ctrl-C (SIGINT) during the fit: its Spark jobs were
                cancelled, its service and threads stopped (:mod:`sparkdl.driver.interrupt`).
        """
        try:
            return self._run()
        finally:
            self._background.settle()

    def _run(self) -> FitResult:
        """The fit itself (:meth:`run`)."""
        started = time.perf_counter()
        tools = session_tools(self.prepared.frame.sparkSession)
        plan = self._plan(tools)
        resolved = self._announce(plan)
        model_bytes = keras_io.model_to_bytes(self.model)
        group = f"sparkdl-fit-{time.time():.0f}-{secrets.token_hex(6)}"
        relay_token = secrets.token_urlsafe(32)
        events: WeightStore | ShardedStore | Relay = (
            self._relay(tools, group, plan, relay_token)
            if plan.hosted
            else self._store(plan, model_bytes)
        )
        runner = self._driver_callbacks(model_bytes, events)
        # The fitted model is rebuilt while the workers train, or is the callbacks'
        # master model, which already exists.
        built = (
            None
            if runner
            else self._background.run(
                lambda: keras_io.model_from_bytes(model_bytes, self.custom_objects),
                name="sparkdl-result-model",
            )
        )
        # Training rows per epoch, all workers together (each holds out its tail).
        rows = plan.held_in(self.prepared.summary.rows)
        name = (
            f"sparkdl fit: {plan.mode.name}/{plan.merge.name}, {plan.num_workers} workers, "
            f"{plan.epochs} epochs, {rows} rows"
        )
        with interrupt_raises(), contextlib.ExitStack() as stack:
            shared = stack.enter_context(tools.shared(model_bytes))
            if not isinstance(events, Relay):
                urls, token, certificate = _serve(
                    stack, events, plan, SparkAttempts(tools.spark_context(), group)
                )
                payload = self._payload(
                    plan, urls[0], token, certificate.pem if certificate else None, shared
                )
                if isinstance(events, ShardedStore):
                    payload = dataclasses.replace(
                        payload, shard_urls=tuple(urls), shard_layout=events.layout.to_json()
                    )
            else:
                payload = self._payload(
                    plan,
                    "",
                    secrets.token_urlsafe(32),
                    None,
                    shared,
                    hosting=self._hosting(plan, group, relay_token, tools),
                )
                layout = self._layout(plan)
                if layout is not None:
                    payload = dataclasses.replace(payload, shard_layout=layout.to_json())
            self._follow_fit(stack, tools, events, group, name, plan, rows, runner)
            prepare_seconds = time.perf_counter() - started + self._checks_seconds()
            reports, result = run_job(
                tools,
                group,
                name,
                lambda: self._launch(tools, payload, events, runner),
                on_interrupt=lambda: events.abort("the fit was interrupted (KeyboardInterrupt)"),
            )
            if isinstance(events, Relay):
                if result is None:
                    raise WorkerError("The training job ended without the service's result.", {})
                events.finish(
                    result["history"], result["status"], result["weights"], result["outer"]
                )
            weights = runner.finish() if runner else _final_weights(events, result)
            history, status = events.history(), events.status()
        trained = runner.master if runner else built.result()  # type: ignore[union-attr]
        report = FitReport(
            seconds=time.perf_counter() - started,
            rows=self.prepared.summary.rows,
            job_group=group,
            service_url=payload.url or str(status.get("url", "")),
            workers=reports,
            service={key: status.get(key) for key in SERVICE_KEYS},
            prepare_seconds=prepare_seconds,
            resolved=resolved,
        )
        return FitResult(
            weights=weights,
            model_bytes=_fitted_bytes(trained, weights, reports),
            history=history,
            report=report,
            input_shapes=self.prepared.input_shapes,
        )

    # ---------------------------------------------------------------- set-up
    def _announce(self, plan: FitPlan) -> dict[str, str]:
        """Checks the recipe against the model's rate and logs (and with ``verbose``
        prints) what the fit resolved; returns it for the report."""
        scheduled = keras_io.scheduled_rate(self.model)
        plan.lr_recipe.check_model(scheduled=scheduled)
        resolved = plan.describe(None if scheduled else keras_io.learning_rate(self.model))
        block = format_resolved(resolved)
        _log.info("%s", block)
        if self.config.verbose:
            print(block, flush=True)
        return resolved

    def _payload(
        self,
        plan: FitPlan,
        url: str,
        token: str,
        tls_cert: bytes | None,
        model_bytes: Any,
        hosting: Hosting | None = None,
    ) -> WorkerPayload:
        """What every training task receives (``model_bytes`` broadcast)."""
        prepared = self.prepared
        return WorkerPayload(
            plan=plan,
            url=url,
            token=token,
            tls_cert=tls_cert,
            model_bytes=model_bytes,
            custom_objects=custom_objects.dumps(self.custom_objects),
            input_shapes=list(prepared.input_shapes),
            label_kinds=list(prepared.label_kinds),
            label_widths=list(prepared.summary.label_widths),
            sparse_columns=list(prepared.sparse or [False] * len(prepared.input_shapes)),
            sparse_inputs=keras_io.sparse_inputs(self.model),
            validation=self.validation is not None,
            weighted=prepared.weighted,
            label_shapes=list(prepared.label_shapes),
            initial_steps=keras_io.optimizer_steps(self.model),
            class_weighted=bool(self.config.class_weight),
            hosting=hosting,
        )

    def _hosting(self, plan: FitPlan, group: str, relay_token: str, tools: SessionTools) -> Hosting:
        """What the workers need to host the service among themselves."""
        outer = self._outer_state(plan)
        return Hosting(
            fit_id=group,
            relay_digest=relay_digest(relay_token),
            gate_epochs=self._gated(),
            history=self.history,
            planned_rows=[],  # set by _launch, from how the job partitions the frame
            bind_host="127.0.0.1" if cluster.parse_local_master(tools.master) else None,
            outer=(
                b"".join(wire.encode(outer[0], {"pushes": outer[1]})) if outer is not None else None
            ),
        )

    def _relay(self, tools: SessionTools, group: str, plan: FitPlan, token: str) -> Relay:
        """The fit's events when the service runs in the cluster: polled by Spark jobs."""
        return Relay(
            self.prepared.frame.sparkSession,
            tools,
            group,
            {
                "fit_id": group,
                "token": token,
                "timeout": plan.request_timeout,
                "layout": layout.to_json() if (layout := self._layout(plan)) else None,
            },
            epochs=plan.epochs,
            history=self.history,
            want_weights=self._gated(),
        )

    def _follow_fit(
        self,
        stack: contextlib.ExitStack,
        tools: SessionTools,
        store: FitEvents,
        group: str,
        name: str,
        plan: FitPlan,
        rows: int,
        runner: DriverCallbacks | None,
    ) -> None:
        """Starts what follows the fit's events on the driver (the relay's polls when
        the service runs in the cluster, the Spark UI's epoch marks, cancelling the job
        on an abort, the progress bar, the driver callbacks), each stopped by
        ``stack``. Spark Connect has no Spark UI marks."""
        if isinstance(store, Relay) and (runner or self.config.verbose):
            _follow(stack, store.start, store.stop)
        sc = tools.spark_context()
        if sc is not None:
            marks = EpochMarks(sc, store, group, name, plan.epochs, plan.initial_epoch)
            _follow(stack, marks.start, marks.stop)
        stack.enter_context(_cancel_on_abort(tools, store, group))
        if self.config.verbose:
            progress = Progress(store, epochs=plan.epochs, rows=rows, verbose=self.config.verbose)
            _follow(stack, progress.start, progress.stop)
        if runner:
            _follow(stack, runner.start, runner.abandon)  # (a no-op after finish)

    def _plan(self, tools: SessionTools) -> FitPlan:
        config = self.config
        placement = config.service_placement
        if placement == "auto":
            placement = "cluster" if tools.connect else "driver"
        hosted = placement == "cluster"
        local_master = bool(cluster.parse_local_master(tools.master))
        if hosted:  # the service binds beside a worker: loopback on a local master
            host, local = ("127.0.0.1" if local_master else "executor"), local_master
        else:
            host = config.service_host or cluster.service_host(tools)
            # Over Spark Connect the service's traffic stays on this machine only when
            # the executors reach this client on loopback.
            local = local_master and (not tools.connect or host == "127.0.0.1")
        # The relay's polls need a task slot beside the training job's.
        relay = hosted and bool(self.callbacks or config.checkpoint_dir or config.verbose)
        return FitPlan.resolve(
            config,
            num_workers=cluster.num_workers(tools, config, hosted=hosted, relay=relay),
            rows=self.prepared.summary.rows,
            threads=cluster.task_cpus(tools),
            service_host=host,
            initial_epoch=self.initial_epoch,
            validation_data=self.validation is not None,
            cache_budget=cluster.cache_budget(tools),
            tf_logs=tensorflow_logs(tools),
            local_master=local,
            optimizer=keras_io.optimizer_kind(self.model),
            service_placement=placement,
        )

    def _checks_seconds(self) -> float:
        """Seconds :func:`sparkdl.driver.data.prepare` took (training and validation data)."""
        return self.prepared.seconds + (self.validation.seconds if self.validation else 0.0)

    def _store(self, plan: FitPlan, model_bytes: bytes) -> WeightStore | ShardedStore:
        """The service's state, with the metric states' merge (its model loads in the
        background meanwhile); with ``service_shards``, one store per shard, shard 0
        merging the metric states."""
        prepared = self.prepared
        metrics = MetricStates(
            lambda: keras_io.model_from_bytes(model_bytes, self.custom_objects),
            prepared.input_shapes,
            prepared.label_kinds,
            prepared.label_shapes,
        )
        metrics.prefetch(self._background)
        weights = self.model.get_weights()
        outer = self._outer_state(plan)
        if plan.service_shards == 1:
            return WeightStore.for_plan(
                plan,
                weights,
                history=self.history,
                gate_epochs=self._gated(),
                metric_merge=metrics.results,
                outer_state=outer,
            )
        layout = self._layout(plan)
        assert layout is not None
        outers = split_outer(layout, outer[0]) if outer else None
        stores = [
            WeightStore.for_plan(
                plan,
                part,
                history=self.history,
                gate_epochs=self._gated(),
                metric_merge=metrics.results if j == 0 else None,
                outer_state=(outers[j], outer[1]) if outers and outer else None,
            )
            for j, part in enumerate(layout.split(weights))
        ]
        return ShardedStore(stores, layout)

    def _outer_state(self, plan: FitPlan) -> tuple[list[np.ndarray], int] | None:
        """The outer optimizer's state to resume from: the checkpoint's, checked against
        the model (``None``: a fresh one, or no outer optimizer).

        Raises:
            ConfigError: The checkpoint's state does not fit the model's weights.
        """
        found = self.outer_state
        if plan.outer is None or found is None:
            if found is not None:
                _log.info("the checkpoint's outer optimizer state is not used: none is set")
            return None
        shapes = [tuple(w.shape) for w in self.model.weights] * 2
        if [tuple(a.shape) for a in found[0]] != shapes:
            raise ConfigError(
                "The checkpoint's outer optimizer state does not match the model's "
                "weights: resume with the model the checkpoint was written from, or "
                "use a new checkpoint_dir."
            )
        return found

    def _layout(self, plan: FitPlan) -> ShardLayout | None:
        """Which part of the weights each shard holds (``None``: one service)."""
        if plan.service_shards == 1:
            return None
        specs = [(w.shape, w.dtype) for w in self.model.weights]
        return ShardLayout.plan(specs, plan.service_shards)

    def _gated(self) -> bool:
        """Driver callbacks see each synchronous epoch before the workers go on."""
        return bool(self.callbacks or self.config.checkpoint_dir)

    def _driver_callbacks(self, model_bytes: bytes, store: FitEvents) -> DriverCallbacks | None:
        callbacks = list(self.callbacks)
        config = self.config
        if config.checkpoint_dir:
            callbacks.append(
                checkpoints.checkpoint_callback(
                    config.checkpoint_dir,
                    config.checkpoint_keep,
                    config.to_dict(),
                    self.history or {},
                    outer=store.epoch_outer_state,
                )
            )
        if not callbacks:
            return None
        return DriverCallbacks(
            callbacks,
            model_bytes,
            self.custom_objects,
            store,
            config.epochs,
            self.initial_epoch,
        )

    # ------------------------------------------------------------ the job
    def _frame(self) -> DataFrame:
        """The training rows, and the validation rows marked in
        :data:`~sparkdl.contract.payload.VALIDATION`, as one frame (every worker gets its share of
        both, and none holds more than its share)."""
        frame = self.prepared.frame
        if self.validation is None:
            return frame
        train = frame.withColumn(VALIDATION, F.lit(False))
        held_out = self.validation.frame.withColumn(VALIDATION, F.lit(True))
        return train.unionByName(held_out)

    def _launch(
        self,
        tools: SessionTools,
        payload: WorkerPayload,
        events: WeightStore | ShardedStore | Relay,
        runner: DriverCallbacks | None,
    ) -> tuple[list[WorkerReport], dict[str, Any] | None]:
        """Runs the training job; returns the workers' reports in worker order and,
        when the service ran in the cluster, its result
        (:func:`~sparkdl.executor.hosting.service_result`).

        Before the job starts, the service learns the most rows each worker may join
        with, from the scan's rows per partition and how the job partitions the frame
        (:meth:`~sparkdl.driver.data_scan.DataSummary.planned_rows`).
        """
        plan = payload.plan
        workers, summary = plan.num_workers, self.prepared.summary
        frame = self._frame()
        # Validation rows come as partitions of their own: shuffle to share them out.
        split = (
            frame.repartition(workers)
            if self.validation
            else _partitioned(frame, workers, tools.num_partitions(frame))
        )
        payload = _planned(
            payload, events, summary.planned_rows(workers, shuffled=split is not frame)
        )
        try:
            if plan.mode.barrier or plan.hosted:
                rows = _run_barrier_job(
                    split,
                    payload,
                    replan=lambda: _planned(
                        payload, events, summary.planned_rows(workers, shuffled=True)
                    ),
                )
            else:  # ordinary tasks: none waits for another, Spark may queue them
                rows = split.mapInArrow(train_function(payload), RESULT_SCHEMA).collect()
        except Exception as exc:
            if runner:
                runner.abandon()
                if runner.error is not None:  # a callback stopped the fit by raising
                    raise runner.error from None
            raise _worker_error(exc, events.failures()) from None
        reports = (WorkerReport.from_json(r["report"]) for r in rows if r["worker"] >= 0)
        layout = self._layout(plan)
        result = service_result(rows, layout) if plan.hosted else None
        return sorted(reports, key=lambda r: r.worker), result


def _planned(
    payload: WorkerPayload, events: WeightStore | ShardedStore | Relay, rows: Sequence[int]
) -> WorkerPayload:
    """Gives the service the driver's plan of rows per worker: the store in this
    process, or the payload for a service the workers host."""
    if payload.hosting is None:
        assert not isinstance(events, Relay)
        events.plan_rows(rows)
        return payload
    return dataclasses.replace(
        payload, hosting=dataclasses.replace(payload.hosting, planned_rows=list(rows))
    )


def _final_weights(
    events: WeightStore | ShardedStore | Relay, result: dict[str, Any] | None
) -> list[np.ndarray]:
    """The center as training ended: the store's, or the hosted service's result."""
    if not isinstance(events, Relay):
        return events.weights()
    assert result is not None
    return list(result["weights"])


def _partitioned(frame: DataFrame, workers: int, partitions: int | None) -> DataFrame:
    """``frame`` in ``workers`` partitions: itself when it has that many
    (``partitions``; ``None``: unknown, as on Spark Connect), else dealt round robin
    (``repartition``: a shuffle).

    Each worker then holds rows the driver can bound from its scan: a partition of
    ``frame`` exactly, or at most its share of each partition rounded up
    (:meth:`~sparkdl.driver.data_scan.DataSummary.planned_rows`). A ``coalesce`` would save
    the shuffle over a multiple of ``workers`` partitions, but which partitions it
    groups is Spark's choice at run time (by where cached blocks live), so the driver
    could not bound a worker's rows by its plan.
    """
    if partitions == workers:
        return frame
    return frame.repartition(workers)


def _run_barrier_job(
    frame: DataFrame, payload: WorkerPayload, replan: Callable[[], WorkerPayload]
) -> list[Any]:
    """Runs the barrier stage so that Spark retries it when a worker is lost.

    Spark never retries a failed barrier *result* stage ("Could not recover from a
    failed barrier ResultStage"), but it does retry a barrier stage whose output feeds
    a shuffle, up to ``spark.stage.maxConsecutiveAttempts`` times; the workers of the
    new attempt rejoin the service at the last completed round. Hence the
    ``repartition(1)`` of the workers' one-row reports.

    Spark also refuses a barrier stage over a chain whose ancestors have another
    partition count (``union``, ``coalesce``...). That check fails at submission,
    before any task runs, so retrying over ``repartition(num_workers)`` loses nothing;
    ``replan`` gives the service the rows that shuffle plans for each worker first
    (and returns the payload to run with).
    """
    train = train_function(payload)
    try:
        return frame.mapInArrow(train, RESULT_SCHEMA, barrier=True).repartition(1).collect()
    except Exception as exc:
        if not is_unsupported_barrier_chain(exc):
            raise
    _log.info("barrier stage needs a shuffle for this DataFrame; repartitioning")
    payload = replan()
    frame = frame.repartition(payload.plan.num_workers)
    train = train_function(payload)
    return frame.mapInArrow(train, RESULT_SCHEMA, barrier=True).repartition(1).collect()


def _serve(
    stack: contextlib.ExitStack,
    store: WeightStore | ShardedStore,
    plan: FitPlan,
    attempts: SparkAttempts,
) -> tuple[list[str], str, Certificate | None]:
    """The fit's parameter service (one per shard, sharing the token and the
    certificate), started (TLS as the plan says) and stopped by ``stack``; returns
    their URLs, the token and the certificate."""
    certificate = Certificate.make(plan.service_host) if plan.service_tls else None
    stores = store.stores if isinstance(store, ShardedStore) else [store]
    if isinstance(store, ShardedStore):
        store.start()
        stack.callback(store.close)
    token = secrets.token_urlsafe(32)
    urls = []
    for j, each in enumerate(stores):
        service = ParameterService(
            each,
            host=plan.service_host,
            port=plan.port + j if plan.port else 0,  # a set port: shard j takes port + j
            token=token,
            attempts=attempts,
            tls=certificate,
        )
        urls.append(stack.enter_context(service).url)
    return urls, token, certificate


def _fitted_bytes(trained: keras.Model, weights: list[np.ndarray], reports: list[Any]) -> bytes:
    """The fitted model as ``.keras`` bytes: ``trained`` with the fit's weights, its
    learning-rate schedule going on from the steps a worker took."""
    trained.set_weights(weights)
    steps = max((r.optimizer_steps for r in reports), default=0)
    keras_io.set_optimizer_steps(trained, steps, only_scheduled=True)
    return keras_io.model_to_bytes(trained)


def _follow(stack: contextlib.ExitStack, start: Any, stop: Any) -> None:
    """Starts a driver thread now and stops it when ``stack`` unwinds."""
    start()
    stack.callback(stop)


@contextlib.contextmanager
def _cancel_on_abort(tools: SessionTools, events: FitEvents, group: str) -> Iterator[None]:
    """Cancels the fit's jobs if it is aborted while the job runs.

    A fatal worker error (or a raising driver callback) aborts the fit: cancel the job
    then, rather than let Spark retry tasks that can only fail again.
    """
    over = threading.Event()

    def watch() -> None:
        while not over.is_set():
            if events.aborted_event.wait(0.2):
                if not over.is_set():
                    tools.cancel(group)
                return

    thread = threading.Thread(target=watch, name="sparkdl-cancel", daemon=True)
    thread.start()
    try:
        yield
    finally:
        over.set()
        if events.aborted_event.is_set():
            # A cancel in flight (a gRPC call on Spark Connect) ends before the fit
            # does; otherwise the thread only waits on the event and ends by itself,
            # and the fit does not wait out its poll.
            thread.join(CANCEL_JOIN_SECONDS)


def _worker_error(exc: Exception, failures: dict[int, str]) -> SparkDLError:
    """The error a failed training job raises on the driver, with the workers' traces."""
    ran_out = retries_ran_out(str(exc))
    if failures and ran_out is None:  # a fatal error a worker reported
        first = next(iter(failures.values())).strip().splitlines()[-1]
        return WorkerError(f"{len(failures)} worker(s) failed during training: {first}", failures)
    trace, last = failure_summary(exc)
    if ran_out is None:
        return WorkerError(f"The training job failed: {last}", {-1: trace})
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
