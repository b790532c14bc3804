"""The large-batch recipe: scale the user's learning rate to the workers, and warm it up.

Synchronous training over n workers averages n workers' steps into one step of the
center, so the global batch is n times ``batch_size``; a learning rate tuned for one
process then takes steps n times too small (Goyal et al. 2017, "Accurate, Large
Minibatch SGD"). ``lr_scaling="linear"`` multiplies the rate by the number of workers
one step of the center averages, ``"sqrt"`` by its square root (the milder rule for
adaptive optimizers such as Adam; Krizhevsky 2014, Hoffer et al. 2017), and
``warmup_epochs`` ramps the rate linearly from the user's rate to the scaled one over
that many epochs (Goyal's gradual warm-up), so the first steps, where the weights move
fastest, are not taken at the full rate.

How many workers one step averages is the merge's to say
(:meth:`~sparkdl.sync.merges.Merge.averaged_workers`): ``num_workers`` for model
averaging and for synchronous deltas (their mean is applied), ``1 / scale`` for
asynchronous deltas (whole-epoch deltas are divided by the number of workers; deltas
added in full average nothing), 1 for elastic averaging (each worker trains at its own
rate and the center follows them).

The driver resolves the factor once (:meth:`LearningRateRecipe.resolve`); each worker
sets its optimizer's rate before every batch from its step count
(:class:`sparkdl.executor.rate.ScaledRate`), so a retried task, whose step count goes
on from where its epoch stood, resumes the ramp where it was. A rate the driver's
callbacks change (``ReduceLROnPlateau``) is the user's rate: workers scale it too.

Example:
    >>> recipe = LearningRateRecipe.resolve("linear", 2.0, averaged_workers=8)
    >>> recipe.factor, recipe.rate(0.1, step=0, steps_per_epoch=10)
    (8.0, 0.1)
    >>> round(recipe.rate(0.1, step=10, steps_per_epoch=10), 4), recipe.rate(0.1, 20, 10)
    (0.45, 0.8)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sparkdl.errors import ConfigError

__all__ = ["LR_SCALINGS", "LearningRateRecipe", "check"]

#: The values of ``lr_scaling`` besides ``None``.
LR_SCALINGS: tuple[str, ...] = ("linear", "sqrt")


@dataclass(frozen=True)
class LearningRateRecipe:
    """The worker's learning rate as a multiple of the user's.

    Attributes:
        factor: The scaled rate over the user's rate.
        warmup_epochs: Epochs over which the rate ramps from the user's to the scaled.
    """

    factor: float = 1.0
    warmup_epochs: float = 0.0

    @classmethod
    def resolve(
        cls, scaling: str | None, warmup_epochs: float, *, averaged_workers: float
    ) -> LearningRateRecipe:
        """The recipe of ``lr_scaling`` and ``warmup_epochs`` for a fit whose center
        averages ``averaged_workers`` workers' steps (on the driver)."""
        check(scaling, warmup_epochs)
        if scaling is None:
            return cls()
        factor = float(averaged_workers) if scaling == "linear" else math.sqrt(averaged_workers)
        return cls(factor=factor, warmup_epochs=float(warmup_epochs))

    @property
    def active(self) -> bool:
        """Whether it changes the user's rate at all."""
        return self.factor != 1.0

    def warmup_steps(self, steps_per_epoch: int) -> float:
        """Optimizer steps the ramp takes at ``steps_per_epoch`` batches an epoch."""
        return self.warmup_epochs * max(steps_per_epoch, 1)

    def rate(self, base: float, step: int, steps_per_epoch: int) -> float:
        """The rate for optimizer step ``step`` (0-based) given the user's ``base``."""
        warm = self.warmup_steps(steps_per_epoch)
        if step < warm:
            return base * (1.0 + (self.factor - 1.0) * step / warm)
        return base * self.factor

    def check_model(self, *, scheduled: bool) -> None:
        """Refuses a model whose optimizer takes its rate from a schedule (``scheduled``):
        there is no number to scale.

        Raises:
            ConfigError: Naming the factor to apply to the schedule by hand.
        """
        if self.active and scheduled:
            raise ConfigError(
                "lr_scaling scales the optimizer's learning rate, but this model's is a "
                "LearningRateSchedule. Scale the schedule's rates by the "
                f"factor yourself ({self.factor:g} here) and drop lr_scaling and "
                "warmup_epochs, or compile with a float learning rate."
            )


def check(scaling: Any, warmup_epochs: Any) -> None:
    """Validates ``lr_scaling`` and ``warmup_epochs`` (the user's settings).

    Raises:
        ConfigError: Naming the setting and what it takes.

    Example:
        >>> check("sqrt", 0.5)
        >>> try:
        ...     check(None, 1)
        ... except ConfigError as exc:
        ...     print(str(exc)[:45])
        warmup_epochs=1 ramps the learning rate up to
    """
    if scaling is not None and scaling not in LR_SCALINGS:
        raise ConfigError(
            f"Expected lr_scaling to be one of {LR_SCALINGS} or None. "
            f"Received: lr_scaling={scaling!r}"
        )
    if (
        isinstance(warmup_epochs, bool)
        or not isinstance(warmup_epochs, (int, float))
        or not math.isfinite(warmup_epochs)
        or warmup_epochs < 0
    ):
        raise ConfigError(
            f"Expected warmup_epochs to be a number >= 0. Received: warmup_epochs={warmup_epochs!r}"
        )
    if warmup_epochs and scaling is None:
        raise ConfigError(
            f"warmup_epochs={warmup_epochs} ramps the learning rate up to the scaled one: "
            "set lr_scaling='linear' (SGD) or 'sqrt' (adaptive optimizers) too."
        )
