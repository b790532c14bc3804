"""A search's MLflow runs: one parent run for the search, a nested run per trial.

When the search's estimator logs to MLflow (``mlflow_run=True`` or a run name, or
MLflow's Keras autologging switched on: :func:`sparkdl.driver.tracking.wanted`), the
search logs its settings to a parent run (the active run, or one it starts, named by
``mlflow_run`` or the study) and each trial to a run nested under it: the trial's
parameters (as ``trial.<name>``), its state (``COMPLETE``, ``PRUNED``, ``FAIL``), its
objective and, from the trial's fit (which logs into the active run of its thread), the
fit's settings, each epoch's merged metrics and the trained model. At the end the
parent run gets the best value and parameters.

MLflow keeps the active run per thread; the trials run in threads of their own, so each
trial's run is created under the parent (the ``mlflow.parentRunId`` tag, what
``mlflow.start_run(nested=True)`` sets) and made the active run of its thread only.

Example:
    >>> SearchRuns.start(False, "study", {}) is None
    True
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sparkdl.driver import tracking

__all__ = ["SearchRuns"]

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
            params: The search's settings, logged to the parent run.
        """
        if not tracking.wanted(mlflow_run):
            return None
        import mlflow

        active = mlflow.active_run()
        owns = active is None
        if active is None:
            name = mlflow_run if isinstance(mlflow_run, str) else study_name
            active = mlflow.start_run(run_name=name)
        runs = cls(mlflow, active.info.run_id, owns)
        runs.client.log_batch(runs.parent, params=_params(params))
        return runs

    @contextlib.contextmanager
    def trial(self, study: Any, trial: Any) -> Iterator[None]:
        """The trial's nested run, the active run of this thread while inside; on the
        way out it gets the trial's parameters (``trial.<name>``), state and value, and
        ends with the status of that state (``KILLED`` for a pruned trial)."""
        run = self.client.create_run(
            self._experiment,
            run_name=f"trial-{trial.number}",
            tags={"mlflow.parentRunId": self.parent, "optuna.trial": str(trial.number)},
        )
        run_id = run.info.run_id
        self._mlflow.start_run(run_id=run_id)
        status = "FAILED"
        try:
            yield
            frozen = study.get_trials(deepcopy=False)[trial.number]
            state = frozen.state.name
            status = _STATUS.get(state, "FAILED")
            # Prefixed: the trial's fit logs its own settings to this run too.
            trial_params = {f"trial.{k}": v for k, v in frozen.params.items()}
            self.client.log_batch(run_id, params=_params(trial_params))
            self.client.set_tag(run_id, "optuna.state", state)
            if frozen.value is not None:
                self.client.log_metric(run_id, "objective", float(frozen.value))
        finally:
            self._mlflow.end_run(status=status)

    def finish(self, study: Any, objective: str) -> None:
        """Logs the best trial to the parent run and ends it if the search started it."""
        try:
            best = study.best_trial
        except ValueError:  # no trial completed
            best = None
        if best is not None:
            self.client.log_metric(self.parent, f"best_{objective}", float(best.value))
            self.client.set_tag(self.parent, "best_trial", str(best.number))
            self.client.log_batch(
                self.parent, params=_params({f"best.{k}": v for k, v in best.params.items()})
            )
        if self.owns:  # started in this thread, by start()
            self._mlflow.end_run()

    def fail(self) -> None:
        """Ends the parent run as failed if the search started it."""
        if self.owns:
            self._mlflow.end_run(status="FAILED")


def _params(values: dict[str, Any]) -> list[Any]:
    """MLflow params of ``values`` (values cut to MLflow's length limit)."""
    from mlflow.entities import Param

    return [Param(str(k), str(v)[:6000]) for k, v in sorted(values.items())]
