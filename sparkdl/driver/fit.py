"""One fit on the driver, made of parts: plan, service, launch, follow, result.

:class:`Fit` reads top to bottom as what happens: the settings and the cluster's facts
are resolved into a :class:`~sparkdl.contract.plan.FitPlan`;
:func:`~sparkdl.driver.service.open_service` builds the fit's parameter service from
it (in the driver, sharded, or hosted by the workers: one
:class:`~sparkdl.driver.service.FitService` interface); the broadcast, the service and
the followers (:class:`~sparkdl.driver.followers.Followers`: the Spark UI marks, the
job canceller, the progress bar, the driver's callbacks and checkpoints) are each
entered into one :class:`contextlib.ExitStack`, so each is torn down, in reverse order,
however the job ends (Ctrl-C included: :mod:`sparkdl.driver.interrupt`); then
:class:`~sparkdl.driver.launcher.JobLauncher` runs the one training job in the fit's
job group, on a driver thread, and the workers' reports and the service's state become
a :class:`FitResult`.

A fit keeps its state in its own objects (its job group, service, token, threads), so
several fits may run at once from threads of one driver.

Example:
    >>> FitResult.__dataclass_fields__["history"].type
    'dict[str, list[float]]'
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkdl.compat.sessions import SessionTools, session_tools
from sparkdl.config import TrainConfig
from sparkdl.contract import custom_objects, keras_io
from sparkdl.contract.metric_states import MetricStates
from sparkdl.contract.payload import WorkerPayload
from sparkdl.contract.plan import FitPlan, format_resolved
from sparkdl.contract.reports import SERVICE_KEYS, FitReport
from sparkdl.driver import arrow_batches, cluster, data, tracking
from sparkdl.driver.background import Background
from sparkdl.driver.followers import Followers
from sparkdl.driver.interrupt import interrupt_raises
from sparkdl.driver.launcher import JobLauncher
from sparkdl.driver.service import ServiceStart, open_service, placement
from sparkdl.driver.warmup import tensorflow_logs
from sparkdl.errors import ConfigError
from sparkdl.sync.outer import MODEL as OUTER_MODEL

if TYPE_CHECKING:
    import keras

__all__ = ["Fit", "FitResult"]

#: The fit's documented logger (the resolved settings, at INFO): its name predates the
#: tier folders and stays.
_log = logging.getLogger("sparkdl.fit")


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
            (:class:`sparkdl.driver.callbacks.DriverCallbacks`); checkpoints run there
            too, and MLflow's epoch logs with ``mlflow_run`` (:mod:`sparkdl.driver.tracking`).
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
        #: The user's callbacks; :meth:`run` adds its MLflow run's to a copy (``callbacks``).
        self.given_callbacks = list(callbacks or [])
        self.callbacks = list(self.given_callbacks)
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
        otherwise crash or hang. With ``mlflow_run`` (or MLflow's Keras autologging on)
        the fit logs to an MLflow run (:mod:`sparkdl.driver.tracking`): the settings as
        it starts, each epoch's logs, and the trained model as it ends, or ``FAILED``.

        Raises:
            ClusterError: The cluster has fewer task slots than a barrier stage needs.
            WorkerError: A worker failed; carries each failed worker's traceback.
            KeyboardInterrupt: Ctrl-C (SIGINT) during the fit: its Spark jobs were
                cancelled, its service and threads stopped (:mod:`sparkdl.driver.interrupt`).
        """
        tracker = self._tracker()
        self.callbacks = [*self.given_callbacks, *([tracker.callback()] if tracker else [])]
        try:
            try:
                result, trained = self._run()
            finally:
                self._background.settle()
        except BaseException:
            if tracker is not None:
                tracker.fail()
            raise
        if tracker is not None:
            tracker.finish(trained)
        return result

    def _tracker(self) -> tracking.Tracker | None:
        """The fit's MLflow run (:mod:`sparkdl.driver.tracking`), its epoch logs one more
        driver callback; ``None`` when the fit does not log to MLflow."""
        config = self.config
        if not tracking.wanted(config.mlflow_run):
            return None
        params = {**config.to_dict(), "params": self.model.count_params()}
        tracker = tracking.Tracker(config.mlflow_run, params)
        return tracker

    def _run(self) -> tuple[FitResult, keras.Model]:
        """The fit itself (:meth:`run`): plan, service, launch, follow, result."""
        started = time.perf_counter()
        tools = session_tools(self.prepared.frame.sparkSession)
        plan = self._plan(tools)
        resolved = self._announce(plan)
        model_bytes = keras_io.model_to_bytes(self.model)
        group = f"sparkdl-fit-{time.time():.0f}-{secrets.token_hex(6)}"
        service = open_service(
            plan, self._service_start(plan, model_bytes), tools=tools, group=group
        )
        followers = Followers(
            service.events,
            self.config,
            self.callbacks,
            model_bytes,
            self.custom_objects,
            initial_epoch=self.initial_epoch,
            history=self.history,
        )
        fitted_model = self._fitted_model(followers, model_bytes)
        # Training rows per epoch, all workers together (each holds out its tail).
        rows = plan.held_in(self.prepared.summary.rows)
        launcher = self._launcher(tools, group, plan, rows)
        with interrupt_raises(), contextlib.ExitStack() as stack:
            shared = stack.enter_context(tools.shared(model_bytes))
            payload = service.open(stack, self._payload(plan, shared))
            followers.start(stack, tools, plan, group, launcher.name, rows)
            prepare_seconds = time.perf_counter() - started + self._checks_seconds()
            reports, job_rows = launcher.run(payload, service, on_failure=followers.failed)
            service.finish(job_rows)
            weights = followers.finish()
            if weights is None:
                weights = service.weights()
            history, status = service.events.history(), service.events.status()
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
        trained = fitted_model()
        result = FitResult(
            weights=weights,
            model_bytes=_fitted_bytes(trained, weights, reports),
            history=history,
            report=report,
            input_shapes=self.prepared.input_shapes,
        )
        return result, trained

    def _fitted_model(self, followers: Followers, model_bytes: bytes) -> Callable[[], keras.Model]:
        """The model the fitted weights go into: the callbacks' master model, which
        already exists, or one rebuilt in the background while the workers train."""
        master = followers.master
        if master is not None:
            return lambda: master
        return self._background.run(
            lambda: keras_io.model_from_bytes(model_bytes, self.custom_objects),
            name="sparkdl-result-model",
        ).result

    def _launcher(self, tools: SessionTools, group: str, plan: FitPlan, rows: int) -> JobLauncher:
        """The fit's job, named for the Spark UI."""
        name = (
            f"sparkdl fit: {plan.mode.name}/{plan.merge.name}, {plan.num_workers} workers, "
            f"{plan.epochs} epochs, {rows} rows"
        )
        validation = self.validation.frame if self.validation is not None else None
        prepared = self.prepared
        summary = prepared.summary
        bytes_per_row = arrow_batches.row_bytes(
            prepared.frame.schema, summary.widths, summary.label_widths, prepared.sparse
        )
        return JobLauncher(tools, group, name, prepared.frame, validation, summary, bytes_per_row)

    # ---------------------------------------------------------------- set-up
    def _plan(self, tools: SessionTools) -> FitPlan:
        """The settings and the cluster's facts, resolved once."""
        config = self.config
        where = placement(config, tools, followed=self._followed())
        return FitPlan.resolve(
            config,
            num_workers=cluster.num_workers(
                tools, config, hosted=where.hosted, relay=where.spare_slot
            ),
            rows=self.prepared.summary.rows,
            threads=cluster.task_cpus(tools),
            service_host=where.host,
            initial_epoch=self.initial_epoch,
            validation_data=self.validation is not None,
            cache_budget=cluster.cache_budget(tools),
            tf_logs=tensorflow_logs(tools),
            local_master=where.local,
            optimizer=keras_io.optimizer_kind(self.model),
            service_placement=where.name,
            optimizer_config=self._model_optimizer(),
            trainable=keras_io.trainable_flags(self.model),
            weight_paths=keras_io.weight_paths(self.model),
        )

    def _model_optimizer(self) -> str:
        """The compiled optimizer, serialized and checked, for ``outer_optimizer="model"``
        (``""`` otherwise)."""
        if self.config.outer_optimizer != OUTER_MODEL:
            return ""
        serialized = keras_io.optimizer_config(self.model)
        keras_io.check_model_outer(self.model, serialized)
        return serialized

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

    def _service_start(self, plan: FitPlan, model_bytes: bytes) -> ServiceStart:
        """What the service starts from: the model's weights, the merge of the metric
        states (its model loads in the background), the resumed history and outer state."""
        prepared = self.prepared

        def metric_merge() -> Callable[[Sequence[Any]], dict[str, float]]:
            metrics = MetricStates(
                lambda: keras_io.model_from_bytes(model_bytes, self.custom_objects),
                prepared.input_shapes,
                prepared.label_kinds,
                prepared.label_shapes,
            )
            metrics.prefetch(self._background)
            return metrics.results

        return ServiceStart(
            specs=[(w.shape, w.dtype) for w in self.model.weights],
            weights=self.model.get_weights,
            metric_merge=metric_merge,
            history=self.history,
            gate_epochs=self._gated(),
            outer_state=self._outer_state(plan),
            followed=self._followed(),
        )

    def _payload(self, plan: FitPlan, model_bytes: Any) -> WorkerPayload:
        """What every training task receives (``model_bytes`` broadcast), but where
        the service is: :meth:`~sparkdl.driver.service.FitService.open` adds that."""
        prepared = self.prepared
        return WorkerPayload(
            plan=plan,
            url="",
            token="",
            model_bytes=model_bytes,
            custom_objects=custom_objects.dumps(self.custom_objects),
            input_shapes=list(prepared.input_shapes),
            label_kinds=list(prepared.label_kinds),
            label_widths=list(prepared.summary.label_widths),
            sparse_columns=list(prepared.sparse or [False] * len(prepared.input_shapes)),
            byte_columns=[k == "bytes" for k in prepared.feature_kinds],
            sparse_inputs=keras_io.sparse_inputs(self.model),
            validation=self.validation is not None,
            weighted=prepared.weighted,
            label_shapes=list(prepared.label_shapes),
            initial_steps=keras_io.optimizer_steps(self.model),
            class_weighted=bool(self.config.class_weight),
            input_structure=keras_io.input_structure(self.model),
        )

    def _outer_state(self, plan: FitPlan) -> tuple[list[np.ndarray], int] | None:
        """The outer optimizer's state to resume from: the checkpoint's, checked against
        the model (``None``: a fresh one, or no outer optimizer).

        Raises:
            ConfigError: The checkpoint's state does not fit the model's weights.
        """
        found = self.outer_state
        if plan.steps_model and found is None:
            found = self._stepped_optimizer(plan)
        if plan.outer is None or found is None:
            if found is not None:
                _log.info("the checkpoint's outer optimizer state is not used: none is set")
            return None
        shapes = plan.outer.state_shapes(self.model.weights)
        if [tuple(a.shape) for a in found[0]] != shapes:
            raise ConfigError(
                "The checkpoint's outer optimizer state does not match the model's "
                "weights: resume with the model the checkpoint was written from, or "
                "use a new checkpoint_dir."
            )
        return found

    def _stepped_optimizer(self, plan: FitPlan) -> tuple[list[np.ndarray], int] | None:
        """``outer_optimizer="model"`` on a model trained before: its optimizer's state
        (step count and slots) for the service to go on from, as ``model.fit`` would."""
        assert plan.outer is not None
        arrays = keras_io.optimizer_arrays(self.model)
        if not arrays:
            return None
        if [tuple(a.shape) for a in arrays] != plan.outer.state_shapes(self.model.weights):
            _log.info("the model's optimizer state does not fit the service's: a fresh one")
            return None
        return arrays, 0

    def _followed(self) -> bool:
        """Something on the driver follows the fit as it runs (callbacks, checkpoints,
        progress)."""
        config = self.config
        return Followers.wanted(
            callbacks=self.callbacks, checkpoint_dir=config.checkpoint_dir, verbose=config.verbose
        )

    def _gated(self) -> bool:
        """Driver callbacks see each synchronous epoch before the workers go on."""
        return bool(self.callbacks or self.config.checkpoint_dir)

    def _checks_seconds(self) -> float:
        """Seconds :func:`sparkdl.driver.data.prepare` took (training and validation data)."""
        return self.prepared.seconds + (self.validation.seconds if self.validation else 0.0)


def _fitted_bytes(trained: keras.Model, weights: list[np.ndarray], reports: list[Any]) -> bytes:
    """The fitted model as ``.keras`` bytes: ``trained`` with the fit's weights, its
    learning-rate schedule going on from the steps a worker took."""
    trained.set_weights(weights)
    steps = max((r.optimizer_steps for r in reports), default=0)
    keras_io.set_optimizer_steps(trained, steps, only_scheduled=True)
    return keras_io.model_to_bytes(trained)
