"""A search's MLflow runs: one parent run for the search, a nested run per trial.

When the search's estimator logs to MLflow (``mlflow_run=True`` or a run name, or
MLflow's Keras autologging switched on: :func:`sparkdl.driver.tracking.wanted`), the
search logs its settings to a parent run (the active run, or one it starts, named by
``mlflow_run`` or the study) and each trial to a run nested under it: the trial's
parameters (as ``trial.<name>``), its state (``COMPLETE``, ``PRUNED``, ``FAIL``), its
objective and, from the trial's fit (which logs into the active run of its thread), the
fit's settings, each epoch's merged metrics and the trained model (a pruned trial's
fit ends normally, so its run holds the model as the fit ended: a synchronous fit's at
the pruned epoch; none if the fit failed after the prune). At the end the parent run
gets the best value and parameters.

MLflow keeps the active run per thread; the trials run in threads of their own, so each
trial's run is created under the parent (the ``mlflow.parentRunId`` tag, what
``mlflow.start_run(nested=True)`` sets) and made the active run of its thread only.

Example:
    >>> SearchRuns.start(False, "study", {}) is None
    True
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from sparkdl.driver import tracking

__all__ = ["SearchRuns"]

_log = logging.getLogger(__name__)

#: MLflow's run status for each of Optuna's final trial states.
_STATUS = {"COMPLETE": "FINISHED", "PRUNED": "KILLED", "FAIL": "FAILED"}


class SearchRuns:
    """The search's parent run and its trials' nested runs.

    Args:
        mlflow: The ``mlflow`` module.
        parent: The parent run's id.
        owns: Whether the search started the parent run (and ends it).
    """

    def __init__(self, mlflow: Any, parent: str, owns: bool) -> None:
        self._mlflow = mlflow
        self.parent = parent
        self.owns = owns
        self.client = mlflow.tracking.MlflowClient()
        self._experiment = self.client.get_run(parent).info.experiment_id

    @classmethod
    def start(
        cls, mlflow_run: bool | str | None, study_name: str, params: dict[str, Any]
    ) -> SearchRuns | None:
        """The search's runs when its fits log to MLflow, else ``None``.

        Args:
            mlflow_run: The estimator's ``mlflow_run`` setting.
            study_name: The study's name (the parent run's name unless ``mlflow_run``
                names it).
            params: The search's settings, logged to the parent run as
                ``search.<name>`` (params on a run it starts, tags on the caller's).

        Raises:
            ConfigError: MLflow is not installed.
        """
        if not tracking.wanted(mlflow_run):
            return None
        mlflow = tracking.import_mlflow()
        active = mlflow.active_run()
        owns = active is None
        if active is None:
            name = mlflow_run if isinstance(mlflow_run, str) else study_name
            active = mlflow.start_run(run_name=name)
        try:
            runs = cls(mlflow, active.info.run_id, owns)
            runs._record({f"search.{k}": v for k, v in params.items()})
        except BaseException:
            if owns:
                _ended(mlflow, "FAILED", "the search's")
            raise
        return runs

    def _record(self, values: dict[str, Any]) -> None:
        """``values`` on the parent run: params on a run the search started, tags on the
        caller's run (which may hold params of the same names with other values)."""
        if self.owns:
            self.client.log_batch(self.parent, params=_params(values))
        else:
            for key, value in values.items():
                self.client.set_tag(self.parent, key, str(value)[:5000])

    @contextlib.contextmanager
    def trial(self, study: Any, trial: Any) -> Iterator[None]:
        """The trial's nested run, the active run of this thread while inside; on the
        way out it gets the trial's parameters (``trial.<name>``), state and value, and
        ends with the status of that state (``KILLED`` for a pruned trial)."""
        run_id = self._open(trial)
        if run_id is None:  # MLflow is a record: the trial runs without its run
            yield
            return
        status = "FAILED"
        try:
            yield
            status = self._trial_logs(run_id, study, trial)
        finally:
            _ended(self._mlflow, status, f"trial {trial.number}'s")

    def _open(self, trial: Any) -> str | None:
        """The trial's run, created under the parent and made this thread's active run;
        ``None`` (said in the log) when MLflow refused."""
        try:
            run = self.client.create_run(
                self._experiment,
                run_name=f"trial-{trial.number}",
                tags={"mlflow.parentRunId": self.parent, "optuna.trial": str(trial.number)},
            )
        except Exception as exc:
            _log.warning("trial %d runs without an MLflow run: %s", trial.number, exc)
            return None
        try:
            self._mlflow.start_run(run_id=run.info.run_id)
        except Exception as exc:  # the run ends now, not left running under the parent
            _log.warning("trial %d runs without an MLflow run: %s", trial.number, exc)
            with contextlib.suppress(Exception):
                self.client.set_terminated(run.info.run_id, "FAILED")
            return None
        return str(run.info.run_id)

    def _trial_logs(self, run_id: str, study: Any, trial: Any) -> str:
        """The trial's parameters, state and value on its run (best effort); returns
        the run's final status for the trial's state."""
        try:
            frozen = study.get_trials(deepcopy=False)[trial.number]
            # Prefixed: the trial's fit logs its own settings to this run too.
            trial_params = {f"trial.{k}": v for k, v in frozen.params.items()}
            self.client.log_batch(run_id, params=_params(trial_params))
            self.client.set_tag(run_id, "optuna.state", frozen.state.name)
            if frozen.value is not None:
                self.client.log_metric(run_id, "objective", float(frozen.value))
            return _STATUS.get(frozen.state.name, "FAILED")
        except Exception as exc:
            _log.warning("trial %d's MLflow run lacks its results: %s", trial.number, exc)
            return "FAILED"

    def finish(self, study: Any, objective: str) -> None:
        """Records the best trial on the parent run (best effort: the search's result
        stands whatever MLflow says) and ends it if the search started it."""
        try:
            try:
                best = study.best_trial
            except ValueError:  # no trial completed
                best = None
            if best is not None:
                self.client.log_metric(self.parent, f"best_{objective}", float(best.value))
                self.client.set_tag(self.parent, "best_trial", str(best.number))
                self._record({f"best.{k}": v for k, v in best.params.items()})
        except Exception as exc:
            _log.warning("the search's MLflow run lacks its best trial: %s", exc)
        finally:
            if self.owns:  # started in this thread, by start()
                _ended(self._mlflow, "FINISHED", "the search's")

    def fail(self) -> None:
        """Ends the parent run as failed if the search started it (an MLflow error is
        logged, never raised over the search's own)."""
        if self.owns:
            _ended(self._mlflow, "FAILED", "the search's")


def _ended(mlflow: Any, status: str, whose: str) -> None:
    """Ends this thread's active run with ``status``; an MLflow error is logged only."""
    try:
        mlflow.end_run(status=status)
    except Exception as exc:
        _log.warning("%s MLflow run did not end: %s", whose, exc)


def _params(values: dict[str, Any]) -> list[Any]:
    """MLflow params of ``values`` (values cut to MLflow's length limit)."""
    from mlflow.entities import Param

    return [Param(str(k), str(v)[:6000]) for k, v in sorted(values.items())]
