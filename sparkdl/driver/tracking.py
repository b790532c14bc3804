"""MLflow tracking of a fit (the optional ``[mlflow]`` extra).

With ``mlflow_run=True`` (or a run name), or with MLflow's Keras autologging switched on
(``mlflow.autolog()`` / ``mlflow.keras.autolog()``), a fit logs to MLflow: the training
settings and the model's parameter count as params when it starts, each epoch's merged
logs as metrics as the epochs close (from the driver, with the epoch as the step), and
the trained model (``mlflow.keras``) at the end. It logs into the active run if there is
one, else into a new run that it ends (``FAILED`` when the fit fails).

Example:
    >>> wanted(False)
    False
"""

from __future__ import annotations

import logging
from typing import Any

from sparkdl.compat.mlflow import keras_autologging_on
from sparkdl.errors import ConfigError

_log = logging.getLogger(__name__)

__all__ = ["Tracker", "import_mlflow", "wanted"]


def import_mlflow() -> Any:
    """The ``mlflow`` module.

    Raises:
        ConfigError: MLflow is not installed; the message says how to install it.
    """
    try:
        import mlflow
    except ImportError as exc:
        raise ConfigError(
            "mlflow_run= needs MLflow: pip install 'mlflow-skinny>=2.16' (the extra "
            "'sparkdl-keras[mlflow]')."
        ) from exc
    return mlflow


def wanted(mlflow_run: bool | str | None) -> bool:
    """Whether a fit with this ``mlflow_run`` setting logs to MLflow."""
    if mlflow_run is False:
        return False
    if mlflow_run is None:  # follow MLflow's Keras autologging switch
        # Switching autologging on imports MLflow (so does Databricks at start); it is
        # not imported here only to ask (that would cost every fit a second and more).
        return keras_autologging_on()
    return True


class Tracker:
    """One fit's MLflow run.

    Args:
        mlflow_run: ``True`` or a run name (used when a new run is started).
        params: Params to log.
    """

    def __init__(self, mlflow_run: bool | str | None, params: dict[str, Any]) -> None:
        mlflow = import_mlflow()
        self._mlflow = mlflow
        active = mlflow.active_run()
        self.owns_run = active is None
        if active is None:
            name = mlflow_run if isinstance(mlflow_run, str) else None
            active = mlflow.start_run(run_name=name)
        self.run_id: str = active.info.run_id
        self.client = mlflow.tracking.MlflowClient()
        # A run that already holds params (the user's run around several fits, a search
        # trial's run on its retry) keeps them: MLflow refuses to change a param.
        held = {} if self.owns_run else self.client.get_run(self.run_id).data.params
        differ = sorted(k for k, v in params.items() if k in held and held[k] != str(v)[:6000])
        if differ:
            _log.warning(
                "MLflow run %s already holds params %s with other values (an earlier fit "
                "in the same run): they keep those values; start a run per fit to log each "
                "fit's own.",
                self.run_id,
                ", ".join(differ),
            )
        self.client.log_batch(
            self.run_id,
            params=[
                mlflow.entities.Param(str(k), str(v)[:6000])
                for k, v in sorted(params.items())
                if str(k) not in held
            ],
        )

    def callback(self) -> Any:
        """A Keras callback (run on the driver) that logs each epoch's logs."""
        import keras

        client, run_id = self.client, self.run_id

        class _LogEpochs(keras.callbacks.Callback):
            def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
                for key, value in (logs or {}).items():
                    client.log_metric(run_id, key, float(value), step=epoch)

        return _LogEpochs()

    def finish(self, model: Any) -> None:
        """Logs the trained model and ends the run if this fit started it."""
        self._mlflow.keras.log_model(model, name="model")
        if self.owns_run:
            self._mlflow.end_run()

    def fail(self) -> None:
        """Ends the run as failed if this fit started it."""
        if self.owns_run:
            self._mlflow.end_run(status="FAILED")
