"""A trial's driver callback: each epoch's merged metrics to Optuna, and pruning.

sparkdl runs Keras callbacks on the driver after every worker has reported an epoch,
with the epoch's logs merged over workers (``val_*`` included). :class:`TrialReporter`
reports the search's objective from them to the trial (``trial.report(value, epoch)``)
and asks its pruner. When the pruner gives up, it sets ``pruned`` and stops the fit as
EarlyStopping does (``model.stop_training``): the workers end after this epoch (a
synchronous fit waits at each epoch's end for the driver's callbacks; an asynchronous
fit's workers do not wait, and may train on until the stop reaches them, an epoch or
more; the epochs they close after the stop are not reported) and the job ends,
freeing its task slots for the next trial. Stopping rather than aborting keeps each
task's Python worker, with TensorFlow imported, for the next trial's task: a task that
fails takes its Python worker with it. When the search itself stops (``stop``), it raises
``optuna.TrialPruned``, which aborts the fit at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import keras

__all__ = ["TrialReporter", "epochs_reported"]


class TrialReporter(keras.callbacks.Callback):
    """Reports ``objective`` to ``trial`` at each epoch's end; prunes.

    Args:
        trial: The ``optuna.Trial``.
        objective: The epoch log reported (``"val_accuracy"``...).
        verbose: Print a line per epoch.
        stop: An event that, once set, stops the trial at its next epoch's end.
        shown: Called with the epochs done and the objective's value at each epoch's
            end (the search's line for the trial).

    Attributes:
        pruned: Whether the pruner stopped the trial (its fit then ends normally).
        epochs: Epochs reported so far.
    """

    def __init__(
        self,
        trial: Any,
        objective: str,
        *,
        verbose: bool = False,
        stop: Any = None,
        shown: Callable[[int, float], None] | None = None,
    ):
        super().__init__()
        self.trial = trial
        self.objective = objective
        self.verbose = verbose
        self.stop = stop
        self.shown = shown
        self.epochs = 0
        self.pruned = False
        self._reported: set[int] = set()

    def restart(self) -> None:
        """The fit runs again from its first epoch (a retry): its epochs are reported
        at their own steps, those reported before not again (Optuna keeps one value
        per step, and pruners compare trials step by step)."""

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        import optuna

        if self.pruned:  # epochs an asynchronous fit closes after its stop: not the trial's
            return
        logs = logs or {}
        self.epochs = max(self.epochs, epoch + 1)
        value = logs.get(self.objective)
        if value is None:
            raise KeyError(
                f"The search's objective {self.objective!r} is not among the epoch's logs "
                f"{sorted(logs)}. Pick one of them (val_* needs validation rows)."
            )
        value = float(value)
        if math.isfinite(value) and epoch not in self._reported:
            self.trial.report(value, epoch)
            self._reported.add(epoch)
        if self.shown is not None:
            self.shown(self.epochs, value)
        if self.verbose:
            print(
                f"sparkdl search: trial {self.trial.number} epoch {self.epochs}: "
                f"{self.objective} {value:.4g}",
                flush=True,
            )
        if self.stop is not None and self.stop.is_set():
            raise optuna.TrialPruned(f"the search stopped at epoch {self.epochs}")
        if not math.isfinite(value) or self.trial.should_prune():
            # Stopped, not aborted: the workers end at this epoch and their tasks return,
            # so Spark keeps their Python workers (TensorFlow imported) for the next
            # trial; a failed task's Python worker exits.
            self.pruned = True
            self.model.stop_training = True


def epochs_reported(trial: Any) -> int:
    """Epochs a stored trial reported (its last step + 1)."""
    steps = getattr(trial, "intermediate_values", None) or {}
    return max(steps) + 1 if steps else 0
