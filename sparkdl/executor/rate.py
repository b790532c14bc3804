"""The worker half of the large-batch recipe: a Keras callback that sets the rate.

Before every batch it sets the optimizer's learning rate to what
:class:`~sparkdl.sync.recipe.LearningRateRecipe` says for the optimizer's step count
(the scaled rate, ramped over the warm-up). The user's rate is read once, when the
first batch begins; a driver callback that changes it (``ReduceLROnPlateau``) passes
the new one through :meth:`ScaledRate.rebase`.

Example:
    >>> from sparkdl.sync.recipe import LearningRateRecipe
    >>> ScaledRate(LearningRateRecipe(factor=4.0), steps_per_epoch=10).recipe.factor
    4.0
"""

from __future__ import annotations

from typing import Any

import keras

from sparkdl.sync.recipe import LearningRateRecipe

__all__ = ["ScaledRate"]


class ScaledRate(keras.callbacks.Callback):
    """Sets the learning rate of the large-batch recipe before every batch.

    Args:
        recipe: The fit's recipe (resolved on the driver).
        steps_per_epoch: The worker's batches per epoch (the warm-up's unit).
    """

    def __init__(self, recipe: LearningRateRecipe, steps_per_epoch: int) -> None:
        super().__init__()
        self.recipe = recipe
        self.steps_per_epoch = steps_per_epoch
        #: The user's rate (what the recipe scales).
        self.base: float | None = None
        self._set: float | None = None
        self._warm = recipe.warmup_steps(steps_per_epoch)
        self._ramped = False  # past the warm-up: the rate stays until a rebase

    def rebase(self, rate: float) -> None:
        """The user's rate changed (a driver callback): scale the new one from now on."""
        self.base = float(rate)
        self._ramped = False
        self._apply()

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Sets the rate for the batch about to run (with ``steps_per_execution``, for
        each execution)."""
        if not self._ramped:
            self._apply()

    def _apply(self) -> None:
        optimizer = self.model.optimizer
        if self.base is None:  # read once: a resumed epoch runs model.fit twice
            self.base = float(optimizer.learning_rate)
        step = int(optimizer.iterations)
        self._ramped = step >= self._warm
        rate = self.recipe.rate(self.base, step, self.steps_per_epoch)
        if rate != self._set:
            optimizer.learning_rate = rate
            self._set = rate
