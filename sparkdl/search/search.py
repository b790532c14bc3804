"""The search: Optuna's ask and tell around concurrent sparkdl fits.

A search keeps ``concurrency`` driver threads busy. Each asks the study for a trial,
calls the user's ``space(trial)`` for the trial's settings (a model and any
:class:`~sparkdl.estimator.KerasEstimator` setting), fits a copy of the estimator with
them, and tells the study how it ended:

* **COMPLETE** with the objective's value at the last epoch;
* **PRUNED** when the pruner gave up on it at an epoch's end
  (:class:`~sparkdl.search.pruning.TrialReporter` reports each epoch's merged
  metrics, the driver's own, and stops the fit as EarlyStopping does: a synchronous
  fit's job ends before the next epoch), even if its fit fails after that;
* **FAIL** with the error's message when its settings, model or fit failed; a fit
  that failed for a cluster reason (a lost executor, a task that ran out of retries) is
  run again first, ``retries`` times.

The study lives in Optuna's storage: with a database URL and a ``study_name`` a search
run again goes on where the last one stopped, running only the trials still missing
(trials left running by a driver that died are marked failed first).

Concurrency is sized from the cluster: every trial's fit takes ``num_workers`` task
slots at once (a synchronous fit is a barrier stage, which must get all of them), so at
most ``slots // num_workers`` trials run at once; the search says what it chose.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparkdl.compat.sessions import is_connect, session_tools
from sparkdl.driver import shared_scans
from sparkdl.errors import ClusterError, ConfigError, ServiceError, WorkerError
from sparkdl.estimator import KerasEstimator
from sparkdl.ml.params import split_settings
from sparkdl.model import KerasModel
from sparkdl.search.progress import SearchProgress
from sparkdl.search.pruning import TrialReporter, epochs_reported
from sparkdl.search.tracking import SearchRuns

if TYPE_CHECKING:
    import optuna
    import pandas as pd
    from pyspark.sql import DataFrame

__all__ = ["Search", "SearchResult"]

_log = logging.getLogger("sparkdl.search")


def cluster_failure(exc: BaseException) -> bool:
    """Whether a fit failed for the cluster's sake, not the trial's: too few slots, an
    unreachable service, or tasks Spark lost or gave up retrying (a lost executor). A
    worker whose training raised (a bad model or setting) is the trial's."""
    if isinstance(exc, (ClusterError, ServiceError)):
        return True
    return isinstance(exc, WorkerError) and not exc.reported


#: Serialises the trials' copies of the search's model and callbacks.
_COPY_LOCK = threading.Lock()
#: Objectives Keras reports that are better high; every loss and error is better low.
_HIGHER = ("accuracy", "auc", "precision", "recall", "f1", "iou", "r2", "cosine", "top_k")
_LOWER = (
    "loss",
    "error",
    "mae",
    "mse",
    "mape",
    "msle",
    "hinge",
    "crossentropy",
    "divergence",
    "poisson",
    "log_cosh",
)
#: The user attribute that marks a trial a dead driver left running.
INTERRUPTED = "interrupted: the search stopped while it ran"


@dataclass
class SearchResult:
    """What a search found.

    Attributes:
        study: The ``optuna.Study`` (every trial, in its storage).
        best_model: The best trial's fitted model (``None`` when it ran in an earlier
            search of a stored study, or no trial completed).
        best_params: The best trial's parameters (Optuna's ``best_params``).
        best_value: The best trial's objective value.
        trials: One row per trial: number, state, value, params, epochs, seconds, error.
        concurrency: Trials run at once.
        workers: Workers of each trial's fit.
    """

    study: optuna.Study
    best_model: KerasModel | None
    best_params: dict[str, Any]
    best_value: float | None
    trials: pd.DataFrame
    concurrency: int
    workers: int


@dataclass
class _Running:
    """The search's shared state between its threads."""

    missing: int
    started: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    models: dict[int, KerasModel] = field(default_factory=dict)
    live: set[Any] = field(default_factory=set)
    runs: SearchRuns | None = None  # MLflow's parent and nested runs, when logged
    progress: SearchProgress = field(default_factory=lambda: SearchProgress(0, 0, 0, 0))

    def keep_if_best(self, study: Any, trial: Any, fitted: KerasModel) -> None:
        """Keeps the fitted model of the best trial so far (and only that one)."""
        with self.lock:
            try:
                best = study.best_trial.number
            except ValueError:
                return
            if best == trial.number:
                self.models = {trial.number: fitted}

    def claim(self) -> bool:
        with self.lock:
            if self.stop.is_set() or self.started >= self.missing:
                return False
            self.started += 1
            return True


class Search:
    """A hyper-parameter search whose trials are concurrent distributed fits.

    Args:
        estimator: The estimator every trial starts from (its columns, settings,
            callbacks and custom objects).
        space: ``space(trial) -> dict``: the trial's settings, chosen with the
            ``optuna.Trial``'s ``suggest_*`` methods: ``"model"`` (a compiled Keras
            model) and any other :class:`~sparkdl.estimator.KerasEstimator` keyword
            (``batch_size``, ``learning_rate``, ``epochs``...).
        objective: The epoch log the study optimises: ``"val_loss"`` (the default),
            ``"val_accuracy"``, or a training metric such as ``"loss"``.
        direction: ``"minimize"`` or ``"maximize"``; ``None``: maximize for an
            accuracy-like objective, minimize for a loss or error.
        trials: How many trials the study should hold when the search ends (a stored
            study's finished trials count).
        concurrency: Trials at once; ``None``: as many as the cluster's task slots
            hold for the trials' workers. Never more than that.
        pruner: ``"asha"`` (Optuna's ``SuccessiveHalvingPruner`` with ``min_resource``
            a quarter of the estimator's epochs, rounded up, and ``reduction_factor=3``;
            the default),
            ``"median"``, ``None`` (none), or any ``optuna.pruners.BasePruner``.
        sampler: Any ``optuna.samplers.BaseSampler``; ``None``: TPE seeded with
            ``seed``.
        seed: Seeds the default sampler, and every trial's fit (``seed`` setting)
            unless the space sets one.
        storage: An Optuna storage URL (``"sqlite:///study.db"``) or object; ``None``:
            in memory.
        study_name: The study's name in ``storage`` (a stored study of that name
            goes on).
        retries: Times a trial whose fit failed for a cluster reason is run again.
        verbose: 1 draws a line per running trial and a study line on a terminal or
            in a notebook with tqdm (elsewhere prints a line as each trial ends); 2
            prints a line as each trial ends and one per trial epoch; 0 prints nothing.

    Example:
        >>> import keras
        >>> net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> net.compile(optimizer="sgd", loss="mse")
        >>> est = KerasEstimator(model=net, features_col="x", label_col="y")
        >>> Search(est, lambda t: {}, objective="val_accuracy").direction
        'maximize'
    """

    def __init__(
        self,
        estimator: KerasEstimator,
        space: Callable[[Any], dict[str, Any]],
        *,
        objective: str = "val_loss",
        direction: str | None = None,
        trials: int = 16,
        concurrency: int | None = None,
        pruner: Any = "asha",
        sampler: Any = None,
        seed: int | None = None,
        storage: Any = None,
        study_name: str | None = None,
        retries: int = 1,
        verbose: int = 1,
    ) -> None:
        if not isinstance(estimator, KerasEstimator):
            raise ConfigError(
                f"Expected a KerasEstimator to search from. Received: {type(estimator).__name__}"
            )
        if not callable(space):
            raise ConfigError("Expected space to be a function of an optuna.Trial.")
        if not isinstance(trials, int) or trials < 1:
            raise ConfigError(f"Expected trials to be an int >= 1. Received: {trials!r}")
        if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 1):
            raise ConfigError(
                f"Expected concurrency to be None or an int >= 1. Received: {concurrency!r}"
            )
        if direction is None:
            direction = _direction(objective)
        if direction not in ("minimize", "maximize"):
            raise ConfigError(
                f"Expected direction 'minimize' or 'maximize'. Received: {direction!r}"
            )
        self.estimator = estimator
        self.space = space
        self.objective = objective
        self.direction = direction
        self.trials = trials
        self.concurrency = concurrency
        self.pruner = pruner
        self.sampler = sampler
        self.seed = seed
        self.storage = storage
        self.study_name = study_name
        self.retries = retries
        self.verbose = verbose

    def fit(self, dataset: DataFrame, validation_data: DataFrame | None = None) -> SearchResult:
        """Runs the trials still missing from the study and returns what it found.

        Args:
            dataset: The training rows (persisted for the search, when they were not).
            validation_data: Rows the ``val_*`` objective is measured on; without them
                the estimator's ``validation_split`` must be set for one.

        Raises:
            ConfigError: Optuna is missing, or the objective needs validation rows.
            KeyboardInterrupt: The search was interrupted; every running trial's job
                was cancelled and marked failed.
        """
        optuna = _optuna()
        config = self.estimator.config
        held_out = config.validation_split or self.estimator.validation_data is not None
        if self.objective.startswith("val_") and validation_data is None and not held_out:
            raise ConfigError(
                f"objective={self.objective!r} is measured on validation rows: pass "
                "validation_data= to fit, or set validation_split on the estimator."
            )
        study = optuna.create_study(
            storage=self.storage,
            study_name=self.study_name,
            direction=self.direction,
            sampler=self.sampler,
            pruner=_pruner(optuna, self.pruner, config.epochs),
            load_if_exists=True,
        )
        if self.sampler is None:  # seeded on from the trials a stored study holds, so
            # that a resumed search does not draw its first trials' parameters again
            done = len(study.get_trials(deepcopy=False))
            seed = None if self.seed is None else self.seed + done
            study.sampler = optuna.samplers.TPESampler(seed=seed)
        _close_stale(optuna, study)
        running = _Running(missing=max(0, self.trials - _finished(optuna, study)))
        concurrency, workers = trial_slots(dataset.sparkSession, self.estimator, self.concurrency)
        running.progress = SearchProgress(self.verbose, running.missing, concurrency, config.epochs)
        running.progress.announce(self.trials, workers)
        persisted = [_persist(df) for df in (dataset, validation_data) if df is not None]
        try:
            settings = _logged_settings(self, concurrency, workers)
            running.runs = SearchRuns.start(config.mlflow_run, study.study_name, settings)
            with shared_scans.sharing():  # trials of the same columns share one data scan
                self._run(study, running, dataset, validation_data, concurrency, workers)
        except BaseException:
            if running.runs is not None:
                running.runs.fail()
            raise
        finally:
            running.progress.close()
            for df in persisted:
                if df is not None:
                    df.unpersist()
        if running.runs is not None:
            running.runs.finish(study, self.objective)
        return _result(study, running, concurrency, workers)

    # ------------------------------------------------------------------ internals

    def _run(
        self,
        study: Any,
        running: _Running,
        dataset: DataFrame,
        validation_data: DataFrame | None,
        concurrency: int,
        workers: int,
    ) -> None:
        threads = [
            threading.Thread(
                target=self._loop,
                args=(study, running, dataset, validation_data, workers),
                name=f"sparkdl-search-{i}",
                daemon=True,
            )
            for i in range(concurrency)
        ]
        for thread in threads:
            thread.start()
        try:
            while any(t.is_alive() for t in threads):
                for thread in threads:
                    thread.join(timeout=0.2)
        except KeyboardInterrupt:
            running.stop.set()
            deadline = time.monotonic() + 30
            # Jobs a trial starts after a cancel (its scan, its next stage) are
            # cancelled too, until every trial's thread has ended or 30 s passed.
            while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
                _cancel_all(dataset)
                for thread in threads:
                    thread.join(timeout=0.5)
            for trial in list(running.live):
                _tell_failed(study, trial, INTERRUPTED)
            raise

    def _loop(
        self,
        study: Any,
        running: _Running,
        dataset: DataFrame,
        validation_data: DataFrame | None,
        workers: int,
    ) -> None:
        """One thread: trials one after another until none is missing."""
        while running.claim():
            try:
                trial = study.ask()
            except Exception as exc:  # the storage failed: this thread stops, said so
                _log.error("the search could not ask its study for a trial: %s", exc)
                running.stop.set()
                return
            running.live.add(trial)
            logged = running.runs.trial(study, trial) if running.runs else contextlib.nullcontext()
            try:
                with logged:  # the trial's nested MLflow run, when the search logs to one
                    self._trial(study, trial, running, dataset, validation_data, workers)
            except BaseException as exc:  # recorded, and the search goes on
                _tell_failed(study, trial, f"{type(exc).__name__}: {exc}")
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    running.stop.set()
                    raise
            finally:
                running.live.discard(trial)
                running.progress.forget(trial)

    def _trial(
        self,
        study: Any,
        trial: Any,
        running: _Running,
        dataset: DataFrame,
        validation_data: DataFrame | None,
        workers: int,
    ) -> None:
        optuna = _optuna()
        started = time.monotonic()
        trial.set_user_attr("started", time.time())
        try:
            estimator, reporter = self._estimator(trial, validation_data, workers, running)
        except Exception as exc:
            _tell_failed(study, trial, f"{type(exc).__name__}: {exc}", started)
            _say(running, study, trial, "FAIL", str(exc))
            return
        running.progress.started(trial, estimator.config.epochs)
        for attempt in range(self.retries + 1):
            if running.stop.is_set():
                _tell_failed(study, trial, INTERRUPTED, started)
                return
            try:
                fitted = estimator.fit(dataset)
                break
            except optuna.TrialPruned:  # the search's stop (the pruner stops the fit)
                if not _told_pruned(study, trial, running, started, reporter):
                    _tell_failed(study, trial, INTERRUPTED, started, reporter)
                return
            except Exception as exc:
                if _told_pruned(study, trial, running, started, reporter):
                    return  # failed after its pruning (its last epochs, its result)
                again = cluster_failure(exc) and attempt < self.retries
                if again and not running.stop.is_set():
                    _log.warning("trial %d failed (%s): running it again", trial.number, exc)
                    trial.set_user_attr("retries", attempt + 1)
                    reporter.restart()
                    if estimator.config.checkpoint_dir:  # from its last checkpointed epoch
                        estimator._set(resume=True)
                    continue
                # A fit the search's own stop cancelled is not the trial's failure.
                why = INTERRUPTED if running.stop.is_set() else f"{type(exc).__name__}: {exc}"
                _tell_failed(study, trial, why, started, reporter)
                _say(running, study, trial, "FAIL", why.splitlines()[0])
                return
        if _told_pruned(study, trial, running, started, reporter):
            return
        _end(trial, started, reporter)
        value = _final(fitted.history, self.objective, _restores_best(estimator), self.direction)
        if value is None:
            message = f"the fit's history has no finite {self.objective!r}"
            _tell_failed(study, trial, message, started, reporter)
            _say(running, study, trial, "FAIL", message)
            return
        study.tell(trial, value)
        running.keep_if_best(study, trial, fitted)
        _say(running, study, trial, "COMPLETE", f"{self.objective} {value:.4g}")

    def _estimator(
        self,
        trial: Any,
        validation_data: DataFrame | None,
        workers: int,
        running: _Running,
    ) -> tuple[KerasEstimator, TrialReporter]:
        """The trial's estimator: the search's, with the space's settings and the
        reporter among its driver callbacks."""
        settings = dict(self.space(trial) or {})
        model = settings.pop("model", None)
        callbacks = settings.pop("callbacks", None)
        custom = settings.pop("custom_objects", None)
        held_out = settings.pop("validation_data", None)
        estimator = self.estimator.copy()
        given = split_settings(settings, {p.name for p in estimator.params})
        if "numWorkers" not in given:
            given["numWorkers"] = workers
        if "seed" not in given and self.seed is not None:
            given["seed"] = self.seed
        given["verbose"] = 0  # the search prints one line per trial instead
        directory = self.estimator.config.checkpoint_dir
        if directory and "checkpointDir" not in given:  # concurrent trials: one folder each
            given["checkpointDir"] = f"{directory.rstrip('/')}/trial-{trial.number}"
        estimator._set(**given)
        estimator.train_config()  # the space's settings, checked
        if custom is not None:
            estimator.custom_objects = dict(custom)
        with _COPY_LOCK:  # one trial at a time reads the search's model and callbacks
            # Each trial gets its own model and callbacks: concurrent fits must not
            # share a model or a callback's state (EarlyStopping's best, say).
            estimator.model = model if model is not None else _copied_model(self.estimator)
            own = copy.deepcopy(
                list(callbacks if callbacks is not None else self.estimator.callbacks)
            )
        if held_out is not None or validation_data is not None:
            estimator.validation_data = held_out if held_out is not None else validation_data
        reporter = _reporter(trial, self.objective, self.verbose, running)
        estimator.callbacks = [*own, reporter]
        return estimator, reporter


def _told_pruned(
    study: Any, trial: Any, running: _Running, started: float, reporter: TrialReporter
) -> bool:
    """Tells the study the trial was pruned, if its pruner stopped it; whether it was."""
    if not reporter.pruned:
        return False
    _end(trial, started, reporter)
    study.tell(trial, state=_optuna().trial.TrialState.PRUNED)
    _say(running, study, trial, "PRUNED", f"at epoch {reporter.epochs}")
    return True


def _reporter(trial: Any, objective: str, verbose: int, running: _Running) -> TrialReporter:
    """The trial's driver callback: its epochs to Optuna, to its line, and the stop."""
    return TrialReporter(
        trial,
        objective,
        verbose=verbose >= 2,
        stop=running.stop,
        shown=lambda epochs, value: running.progress.epoch(trial, epochs, objective, value),
    )


def _logged_settings(search: Search, concurrency: int, workers: int) -> dict[str, Any]:
    """The search's settings, as its MLflow parent run logs them (the concurrency and
    workers per trial it chose)."""
    pruner = search.pruner
    return {
        "objective": search.objective,
        "direction": search.direction,
        "trials": search.trials,
        "concurrency": concurrency,
        "workers": workers,
        "pruner": pruner if isinstance(pruner, str | None) else _name(pruner),
        "sampler": _name(search.sampler) if search.sampler is not None else "TPESampler",
        "seed": search.seed,
    }


def _name(value: Any) -> str:
    """A sampler's or pruner's class name."""
    return type(value).__name__


def _say(running: _Running, study: Any, trial: Any, state: str, detail: str) -> None:
    """The line saying how a trial ended, with the study's counts and best so far."""
    if not running.progress.verbose:
        return
    counts = _counts(study)
    try:
        best = f", best {study.best_value:.4g} (trial {study.best_trial.number})"
    except ValueError:
        best = ""
    running.progress.ended(
        trial,
        f"sparkdl search: trial {trial.number} {state} ({detail})",
        f"{counts['COMPLETE']} complete, {counts['PRUNED']} pruned, {counts['FAIL']} failed{best}",
    )


def _result(study: Any, running: _Running, concurrency: int, workers: int) -> SearchResult:
    try:
        best = study.best_trial
        value, params = best.value, dict(best.params)
        model = running.models.get(best.number)
    except ValueError:  # no trial completed
        value, params, model = None, {}, None
    return SearchResult(
        study=study,
        best_model=model,
        best_params=params,
        best_value=value,
        trials=trials_frame(study),
        concurrency=concurrency,
        workers=workers,
    )


def trial_slots(spark: Any, estimator: KerasEstimator, requested: int | None) -> tuple[int, int]:
    """``(trials at once, workers per trial)`` from the cluster's task slots: a trial
    takes its workers' slots, and one more when its service runs in the cluster (its
    relay's polls need a free slot while the search follows the fit).

    Args:
        spark: The session.
        estimator: The search's estimator (``num_workers``, ``service_placement``).
        requested: The search's ``concurrency`` (``None``: as many as the slots hold).
    """
    slots = max(1, session_tools(spark).slots())
    config = estimator.config
    placement = config.service_placement
    spare = int(placement == "cluster" or (placement == "auto" and is_connect(spark)))
    workers = config.num_workers
    if workers is None:
        workers = max(1, slots // (requested or 1) - spare)
    most = max(1, slots // (workers + spare))
    concurrency = min(requested or most, most)
    if requested and concurrency < requested:
        _log.warning(
            "concurrency=%d lowered to %d: %d task slot(s) hold %d trial(s) of %d worker(s)%s",
            requested,
            concurrency,
            slots,
            concurrency,
            workers,
            " and a slot for the service's relay" if spare else "",
        )
    return concurrency, workers


def trials_frame(study: Any) -> pd.DataFrame:
    """One row per trial of ``study``: number, state, value, params, epochs, seconds,
    error, started (``time.time()``)."""
    import pandas as pd

    rows = [
        {
            "number": t.number,
            "state": t.state.name,
            "value": t.value,
            "params": dict(t.params),
            "epochs": t.user_attrs.get("epochs", epochs_reported(t)),
            "seconds": t.user_attrs.get("seconds"),
            "error": t.user_attrs.get("error"),
            "started": t.user_attrs.get("started"),
        }
        for t in study.get_trials(deepcopy=False)
    ]
    columns = ["number", "state", "value", "params", "epochs", "seconds", "error", "started"]
    return pd.DataFrame(rows, columns=columns)


def _optuna() -> Any:
    try:
        import optuna
    except ImportError as exc:
        raise ConfigError(
            "sparkdl.search needs Optuna: install sparkdl-keras's [search] extra, or "
            "pip install optuna."
        ) from exc
    return optuna


def _pruner(optuna: Any, pruner: Any, epochs: int) -> Any:
    if pruner == "asha":
        # The first rung a quarter of the epochs in, a third kept at each: judged after
        # its 2nd epoch with a quarter kept (Optuna's defaults), a trial's rank had not
        # settled (teacher workload, 16 trials of 8 epochs: best 0.739-0.748
        # against 0.759 so, and 0.755 without pruning; docs/benchmarks/search.md).
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=max(1, math.ceil(epochs / 4)), reduction_factor=3
        )
    if pruner == "median":
        return optuna.pruners.MedianPruner(n_warmup_steps=1)
    if pruner is None:
        return optuna.pruners.NopPruner()
    if isinstance(pruner, optuna.pruners.BasePruner):
        return pruner
    raise ConfigError(
        f"Expected pruner 'asha', 'median', None or an optuna pruner. Received: {pruner!r}"
    )


#: The study's user attribute listing the trials a dead driver left running.
STALE = "sparkdl_interrupted"


def _direction(objective: str) -> str:
    """``"maximize"`` or ``"minimize"`` for a metric's name.

    Raises:
        ConfigError: The name says neither.
    """
    name = objective.lower()
    if any(token in name for token in _LOWER):
        return "minimize"
    if any(token in name for token in _HIGHER):
        return "maximize"
    raise ConfigError(
        f"Cannot tell whether objective={objective!r} is better high or low: pass "
        "direction='maximize' or direction='minimize'."
    )


def _copied_model(estimator: KerasEstimator) -> Any:
    """A trial's own copy of the search's model (its fit may not share it)."""
    from sparkdl.contract import keras_io

    return keras_io.copy_model(estimator.model, estimator.custom_objects or None)


def _restores_best(estimator: KerasEstimator) -> bool:
    """Whether a callback of ``estimator`` gives the fitted model its best epoch's
    weights (EarlyStopping's ``restore_best_weights``)."""
    return any(getattr(c, "restore_best_weights", False) for c in estimator.callbacks)


def _finished(optuna: Any, study: Any) -> int:
    """Trials of ``study`` that ended (complete, pruned, or failed by their own fault)."""
    states = optuna.trial.TrialState
    stale = set(study.user_attrs.get(STALE, []))
    return sum(
        1
        for t in study.get_trials(deepcopy=False)
        if t.state in (states.COMPLETE, states.PRUNED)
        or (
            t.state == states.FAIL
            and t.user_attrs.get("error") != INTERRUPTED
            and t.number not in stale
        )
    )


def _close_stale(optuna: Any, study: Any) -> None:
    """Marks trials left running by an earlier search failed, listed in the study's
    :data:`STALE` attribute: a driver that died never told their end, and they do not
    count as finished."""
    states = optuna.trial.TrialState
    left = [t.number for t in study.get_trials(deepcopy=False, states=(states.RUNNING,))]
    if not left:
        return
    study.set_user_attr(STALE, sorted({*study.user_attrs.get(STALE, []), *left}))
    for number in left:
        study.tell(number, state=states.FAIL)


def _counts(study: Any) -> dict[str, int]:
    counts = {"COMPLETE": 0, "PRUNED": 0, "FAIL": 0, "RUNNING": 0, "WAITING": 0}
    for t in study.get_trials(deepcopy=False):
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    return counts


def _final(
    history: dict[str, list[float]], objective: str, best: bool = False, direction: str = ""
) -> float | None:
    """The objective's value at the last epoch, or its best in ``direction`` when the
    fitted model holds its best epoch's weights (``best``); ``None``: missing or not
    finite."""
    import math

    values = [float(v) for v in history.get(objective) or []]
    if best and values:
        finite = [v for v in values if math.isfinite(v)]
        if finite:
            return max(finite) if direction == "maximize" else min(finite)
    if not values or not math.isfinite(values[-1]):
        return None
    return values[-1]


def _end(trial: Any, started: float, reporter: TrialReporter | None) -> None:
    trial.set_user_attr("seconds", round(time.monotonic() - started, 3))
    if reporter is not None:
        trial.set_user_attr("epochs", reporter.epochs)


def _tell_failed(
    study: Any,
    trial: Any,
    message: str,
    started: float | None = None,
    reporter: TrialReporter | None = None,
) -> None:
    """Records ``message`` on the trial and tells the study it failed (once)."""
    optuna = _optuna()
    try:
        trial.set_user_attr("error", message[:2000])
        if started is not None:
            _end(trial, started, reporter)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    except (RuntimeError, ValueError):  # already told
        pass


def _persist(df: DataFrame) -> DataFrame | None:
    """Persists ``df`` for the search's many reads of it; ``None`` when it already was
    (it is then not the search's to unpersist)."""
    try:
        if df.storageLevel.useMemory or df.storageLevel.useDisk:
            return None
        return df.persist()
    except Exception:  # a session that cannot persist reads it again
        return None


def _cancel_all(dataset: DataFrame) -> None:
    """Cancels every Spark job of the session (Ctrl-C: every trial's fit)."""
    spark = dataset.sparkSession
    try:
        if is_connect(spark):
            spark.interruptAll()
        else:
            spark.sparkContext.cancelAllJobs()
    except Exception as exc:  # the interrupt goes on: the trials' threads end anyway
        _log.warning("could not cancel the search's Spark jobs: %s", exc)
