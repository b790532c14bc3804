"""The Keras callback through which a worker's ``model.fit`` syncs with the service.

It pushes at the schedule's points (every ``frequency`` batches, the epoch's closing
sync with its logs, padding rounds of a short partition), stops training on a diverged
loss, and applies what the driver decided (``stop_training``, a new learning rate) as
the answers bring it. The epoch's closing push also carries the states of the model's
metrics, training and validation apart (:mod:`sparkdl.contract.metric_states`), which the
service sums into exact per-epoch metrics. Keras's fit resets the metrics before it
validates, so the training states are read as validation begins (``on_test_begin``).

Example:
    >>> issubclass(SyncCallback, keras.callbacks.Callback)
    True
"""

from __future__ import annotations

import math
from typing import Any

import keras

from sparkdl.contract.metric_states import MetricStates
from sparkdl.errors import TrainingError
from sparkdl.executor.channel import PushPath
from sparkdl.executor.rate import ScaledRate
from sparkdl.sync.schedule import Schedule

__all__ = ["SyncCallback"]


class SyncCallback(keras.callbacks.Callback):
    """Pushes an update at every sync point of ``schedule``.

    Args:
        pusher: Sends pushes and folds answers in.
        schedule: The worker's sync points.
        val_rows: Validation rows behind the epoch's ``val_*`` logs.
        rate: The learning-rate recipe's callback (``lr_scaling``), or ``None``.
        last_epoch: The epoch the fit ends at (``FitPlan.epochs``).
        service_rate: The service's optimizer, not the worker's, takes a rate the
            driver sets (``outer_optimizer="model"``).
    """

    def __init__(
        self,
        pusher: PushPath,
        schedule: Schedule,
        *,
        val_rows: int = 0,
        rate: ScaledRate | None = None,
        last_epoch: int = 0,
        service_rate: bool = False,
    ) -> None:
        super().__init__()
        #: The service's optimizer takes a new rate (``outer_optimizer="model"``): the
        #: worker's own stays 1.
        self.service_rate = service_rate
        #: The epoch the fit ends at (its closing pushes go whole under a codec).
        self.last_epoch = last_epoch
        #: The large-batch recipe's callback, which scales a rate the driver sets.
        self.rate = rate
        self.pusher = pusher
        self.schedule = schedule
        self.val_rows = val_rows
        #: A driver callback stopped the fit.
        self.stop = False
        #: The epoch the worker is in (1-based) once it began.
        self.epochs_run = 0
        self.learning_rate: float | None = None
        self._epoch = 0
        self._offset = 0  # batches of the epoch done before this fit call (a resume)
        self._done = 0  # syncs made this epoch
        self._sent = 0  # rows of this epoch already pushed
        self._resume: tuple[int, int] | None = None
        self._train_states: list[list[float]] | None = None
        self._validated = False
        self._step = 0  # batches of the epoch done
        self._testing = False
        self._held: list[Any] | None = None  # local weights while the center validates

    def position(self) -> str:
        """Where training stands, for a failure's first line: ``"epoch 3 of 20, batch
        12"`` (1-based: the batch being trained when it failed), or its validation."""
        if not self.epochs_run:
            return "before the first epoch"
        where = f"epoch {self.epochs_run} of {self.last_epoch}"
        return f"{where}, validation" if self._testing else f"{where}, batch {self._step + 1}"

    def resume(self, batches: int, syncs: int) -> None:
        """The next epoch starts with ``batches`` done and ``syncs`` made (a retry)."""
        self._resume = (batches, syncs)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.epochs_run = epoch + 1
        self._epoch = epoch
        batches, syncs = self._resume or (0, 0)
        self._resume = None
        self._offset, self._done = batches, syncs
        self._sent = self.schedule.seen(batches)
        self._train_states, self._validated = None, False
        self._step, self._testing = batches, False

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._testing = True
        # model.fit validates: the metrics still hold the epoch's training states.
        self._train_states, self._validated = MetricStates.read(self.model), True
        if self.service_rate:
            # The local weights are the center less the last batch's raw gradient (the
            # epoch's closing round comes after validation): validate the center.
            self._held = self.model.get_weights()
            self.model.set_weights(self.pusher.center)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        step = self._offset + batch + 1
        while self._done < self.schedule.due(step):
            self._sync(self.schedule.seen(step), logs or {}, None)
        self._step = step  # a failure in the syncs above names the batch just trained

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        self._testing = False
        if self._held is not None:
            self.model.set_weights(self._held)
            self._held = None

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        logs = logs or {}
        rows = self.schedule.rows
        end = self.schedule.epoch_end(self._done)
        # The fit's last epoch, or a stop that arrived within this one: the epoch's
        # remaining pushes go whole, so what a codec's error feedback held back reaches
        # the center (the first of them carries it, with the epoch's last samples).
        last = self.stop or self._epoch + 1 >= self.last_epoch
        for _ in range(end.mid):
            self._sync(rows, logs, None, whole=last)
        for _ in range(end.padding if end.first else 0):
            self._sync(rows, {}, None)
        if end.closes:
            self._sync(rows, logs, logs, self._epoch_states(logs), whole=last)
        for _ in range(0 if end.first else end.padding):  # every worker in every round
            self._sync(rows, {}, None)
        if self.stop:
            self.model.stop_training = True  # a driver callback stopped the fit

    def flush(self) -> None:
        """Folds in the answer to a push still in flight (overlap)."""
        if self.pusher.flush():
            self._take_control()

    def _epoch_states(self, logs: dict[str, Any]) -> dict[str, Any] | None:
        """The epoch's metric states, training and validation (``None`` before any
        batch: an empty partition)."""
        if not logs:
            return None
        if self._validated:
            return {"train": self._train_states, "val": MetricStates.read(self.model)}
        return {"train": MetricStates.read(self.model), "val": None}

    def _sync(
        self,
        seen: int,
        logs: dict[str, Any],
        epoch_logs: dict[str, Any] | None,
        states: dict[str, Any] | None = None,
        *,
        whole: bool = False,
    ) -> None:
        loss = logs.get("loss")
        loss = float(loss) if loss is not None else None
        if loss is not None and not math.isfinite(loss):
            scaled = ""
            if self.rate is not None:
                scaled = (
                    f" The workers trained at {self.rate.recipe.factor:g} times the model's "
                    "learning rate (lr_scaling, 'auto' by default): ramp up to it with "
                    "warmup_epochs=..., or set lr_scaling=None."
                )
            raise TrainingError(
                f"The loss became {loss} in epoch {self._epoch + 1}: training diverged. "
                "Lower the learning rate, clip gradients (clipnorm=...), or scale the "
                f"features.{scaled}"
            )
        # "step": batches of this epoch done, where a retried task resumes from.
        meta: dict[str, Any] = {
            "loss": loss,
            "epoch": self._epoch,
            "step": self.schedule.step_of(seen),
        }
        if epoch_logs is not None:
            # A metric with no value this epoch (NaN) travels as null: the service
            # refuses NaN, which JSON cannot carry.
            meta["epoch_logs"] = {k: _finite_or_none(v) for k, v in epoch_logs.items()}
            meta["epoch_samples"] = self.schedule.rows
            meta["val_samples"] = self.val_rows
            if states is not None:
                meta["epoch_states"] = states
        # An epoch's closing push waits for its answer, so every epoch starts from
        # the center.
        if self.pusher.push(
            seen - self._sent, meta, wait=epoch_logs is not None, whole=whole, index=self._done
        ):
            self._take_control()
        self._sent = seen
        self._done += 1

    def _take_control(self) -> None:
        """Applies the control fields of the answer just folded in."""
        control = self.pusher.control
        if control.get("stop"):
            # Stop at this sync: Keras leaves the epoch after this batch, and
            # on_epoch_end still closes the epoch's rounds, the same ones on every
            # worker, so synchronous rounds stay aligned.
            self.stop = True
            self.model.stop_training = True
        rate = control.get("learning_rate")
        if isinstance(rate, (int, float)) and rate != self.learning_rate:
            self.learning_rate = float(rate)  # ReduceLROnPlateau: the model's rate
            if self.rate is not None:
                self.rate.rebase(self.learning_rate)  # scaled for the workers
            elif not self.service_rate:
                self.model.optimizer.learning_rate = self.learning_rate


def _finite_or_none(value: Any) -> float | None:
    number = float(value)
    return number if math.isfinite(number) else None
