"""The learning-rate recipe: scale the user's rate to the workers, and warm it up.

A model compiled for one process takes, in one pass over the data, one step per batch.
Spread over n workers the same pass moves sparkdl's center less far: averaging n
workers' steps into one step of the center takes 1/n as many steps (synchronous
training multiplies the global batch by n), and elastic averaging moves the center
``n / (n + 1)`` of one worker's step per round. A rate tuned for one process then
leaves the fit behind plain Keras after the same epochs: on digits with 2 workers and
SGD, 1-3 points (``benchmarks/digits.py``); with 8 workers on the teacher workload, 36
points (``benchmarks/large_batch.py``).

``lr_scaling="linear"`` multiplies the rate by the merge's factor
(:meth:`~sparkdl.sync.merges.Merge.lr_factor`: ``num_workers`` for model averaging and
synchronous deltas, ``1 / scale`` for asynchronous deltas, ``num_workers + 1`` for
elastic averaging), the linear scaling rule of Goyal et al. 2017 ("Accurate, Large
Minibatch SGD"); ``"sqrt"`` by its square root, the rule for adaptive optimizers on
large batches (Adam's steps are normalised by the gradients' size; Hoffer et al. 2017,
Malladi et al. 2022). ``"auto"``, the default, takes ``"linear"`` for
``keras.optimizers.SGD`` (with or without momentum) and, in synchronous mode, for every
other optimizer too; ``"sqrt"`` for other optimizers in asynchronous and hogwild modes;
and leaves a ``LearningRateSchedule`` as it is (with a warning that names the factor).
Synchronous rounds average the workers' steps, so each must be k times longer for the
center to move as far as one process: on digits at Keras's default rates, the square
root left Adam and RMSprop 0.4-1.9 points short with 2 workers and up to 3.2 with 8,
linear 0.8 or less (``benchmarks/parity.py``). Asynchronous pushes land one by one
between hundreds of steps, where linear did worse on the teacher workload.
``warmup_epochs`` ramps the rate linearly from the user's rate to the scaled one over
that many epochs (Goyal's gradual warm-up), so the first steps, where the weights move
fastest, are not taken at the full rate.

The driver resolves the factor once (:meth:`LearningRateRecipe.resolve`); each worker
sets its optimizer's rate before every batch from its step count
(:class:`sparkdl.executor.rate.ScaledRate`), so a retried task, whose step count goes
on from where its epoch stood, resumes the ramp where it was. A rate the driver's
callbacks change (``ReduceLROnPlateau``) is the user's rate: workers scale it too. The
fitted model keeps the user's rate.

Example:
    >>> recipe = LearningRateRecipe.resolve("linear", 2.0, lr_factor=8)
    >>> recipe.factor, recipe.rate(0.1, step=0, steps_per_epoch=10)
    (8.0, 0.1)
    >>> round(recipe.rate(0.1, step=10, steps_per_epoch=10), 4), recipe.rate(0.1, 20, 10)
    (0.45, 0.8)
    >>> LearningRateRecipe.resolve("auto", 0, lr_factor=4, optimizer="adaptive").factor
    2.0
    >>> LearningRateRecipe.resolve(
    ...     "auto", 0, lr_factor=4, optimizer="adaptive", synchronous=True).factor
    4.0
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from sparkdl.errors import ConfigError

__all__ = [
    "AUTO",
    "AUTO_SYNCHRONOUS",
    "LR_SCALINGS",
    "OPTIMIZER_KINDS",
    "LearningRateRecipe",
    "check",
    "resolve_scaling",
]

#: The values of ``lr_scaling`` besides ``None``.
LR_SCALINGS: tuple[str, ...] = ("auto", "linear", "sqrt")
#: What :func:`sparkdl.contract.keras_io.optimizer_kind` tells apart: plain gradient steps
#: (``SGD``, with or without momentum), steps normalised by the gradients' size (Adam,
#: RMSprop, LARS...), and rates read from a ``LearningRateSchedule``.
OPTIMIZER_KINDS: tuple[str, ...] = ("sgd", "adaptive", "scheduled")
#: What ``lr_scaling="auto"`` (the default) is for each kind of optimizer; a schedule
#: is left as it is (there is no number to scale).
AUTO: dict[str, str | None] = {"sgd": "linear", "adaptive": "sqrt", "scheduled": None}
#: ... and in synchronous mode, where an adaptive optimizer takes the linear rule too.
AUTO_SYNCHRONOUS: dict[str, str | None] = {**AUTO, "adaptive": "linear"}

#: Why ``lr_scaling="auto"`` picked its rule, for each kind of optimizer.
_AUTO_WHY = {
    "sgd": "linear for SGD",
    "adaptive": "sqrt for an adaptive optimizer outside synchronous rounds",
    "adaptive/synchronous": "linear in synchronous rounds, for an adaptive optimizer too",
    "scheduled": "'auto' leaves a LearningRateSchedule unscaled",
}

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LearningRateRecipe:
    """The worker's learning rate as a multiple of the user's.

    Attributes:
        factor: The scaled rate over the user's rate.
        warmup_epochs: Epochs over which the rate ramps from the user's to the scaled.
        reason: Why the factor is what it is (:meth:`explain` prints it).
    """

    factor: float = 1.0
    warmup_epochs: float = 0.0
    #: Why, in words: the setting, the rule it resolved to and the merge's factor (not
    #: compared: two recipes that scale alike are equal).
    reason: str = field(default="", compare=False)

    @classmethod
    def resolve(
        cls,
        scaling: str | None,
        warmup_epochs: float,
        *,
        lr_factor: float,
        optimizer: str = "sgd",
        synchronous: bool = False,
    ) -> LearningRateRecipe:
        """The recipe of ``lr_scaling`` and ``warmup_epochs`` (on the driver).

        Args:
            scaling: The user's ``lr_scaling``.
            warmup_epochs: The user's ``warmup_epochs``.
            lr_factor: How many times farther one process moves than the fit's center
                at the same rate (:meth:`~sparkdl.sync.merges.Merge.lr_factor`).
            optimizer: The model's optimizer kind (one of :data:`OPTIMIZER_KINDS`).
            synchronous: Whether pushes merge in barrier rounds (the mode's
                ``barrier``).
        """
        check(scaling, warmup_epochs)
        return cls.of_resolved(
            scaling,
            resolve_scaling(scaling, optimizer, synchronous=synchronous),
            warmup_epochs,
            lr_factor=lr_factor,
            optimizer=optimizer,
            synchronous=synchronous,
        )

    @classmethod
    def of_resolved(
        cls,
        asked: str | None,
        scaling: str | None,
        warmup_epochs: float,
        *,
        lr_factor: float,
        optimizer: str,
        synchronous: bool = False,
    ) -> LearningRateRecipe:
        """The recipe of a checked ``lr_scaling`` whose ``"auto"`` is already resolved.

        :class:`~sparkdl.contract.plan.FitPlan` resolves ``"auto"`` once
        (:func:`resolve_scaling`), since the merge needs the answer too, and passes both.

        Args:
            asked: The user's ``lr_scaling``, for the reason.
            scaling: What it resolved to for this model's optimizer.
            warmup_epochs: The user's ``warmup_epochs``.
            lr_factor: The merge's factor (:meth:`~sparkdl.sync.merges.Merge.lr_factor`).
            optimizer: The model's optimizer kind (one of :data:`OPTIMIZER_KINDS`).
            synchronous: Whether pushes merge in barrier rounds (for the reason).

        Example:
            >>> LearningRateRecipe.of_resolved(
            ...     "auto", "sqrt", 0.0, lr_factor=4.0, optimizer="adaptive").factor
            2.0
        """
        if asked == "auto":
            if scaling is None and warmup_epochs:
                # Kept so check_model refuses it: there is no rate to ramp.
                return cls(warmup_epochs=float(warmup_epochs))
            if scaling is None and lr_factor != 1.0:
                _log.warning(
                    "The model's learning rate comes from a LearningRateSchedule, which "
                    "lr_scaling='auto' leaves unscaled: with this mode and merge the "
                    "center moves about 1/%g as far per sample as one process does. For "
                    "the accuracy one process reaches, multiply the schedule's rates by "
                    "%g.",
                    lr_factor,
                    lr_factor,
                )
        why = _AUTO_WHY[
            f"{optimizer}/synchronous" if synchronous and optimizer == "adaptive" else optimizer
        ]
        if scaling is None:
            return cls(reason="lr_scaling=None" if asked is None else why)
        factor = float(lr_factor) if scaling == "linear" else math.sqrt(lr_factor)
        rule = f"lr_scaling={asked!r}" + (f": {why}" if asked == "auto" else "")
        merge = ("the square root of " if scaling == "sqrt" else "") + (
            f"the merge's factor {lr_factor:g}"
        )
        return cls(factor=factor, warmup_epochs=float(warmup_epochs), reason=f"{rule}; {merge}")

    def explain(self, rate: float | None) -> str:
        """The workers' learning rate against the compiled one, and why, in one line.

        Args:
            rate: The compiled (or ``learning_rate``-overridden) rate; ``None`` when it
                comes from a schedule.

        Example:
            >>> recipe = LearningRateRecipe.resolve("auto", 0.0, lr_factor=2.0)
            >>> recipe.explain(0.01).split(" (")[0]
            'workers train at 0.02 = the compiled 0.01 x 2'
            >>> recipe.reason
            "lr_scaling='auto': linear for SGD; the merge's factor 2"
        """
        ramp = (
            f", ramped up from the compiled rate over {self.warmup_epochs:g} epoch(s)"
            if self.warmup_epochs and self.active
            else ""
        )
        if rate is None:
            return f"workers train at the model's learning-rate schedule, unscaled ({self.reason})"
        if not self.active:
            return f"workers train at the compiled {rate:.4g}, unscaled ({self.reason})"
        return (
            f"workers train at {rate * self.factor:.4g} = the compiled {rate:.4g} x "
            f"{self.factor:.4g} ({self.reason}){ramp}"
        )

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
        there is no number to scale or ramp.

        Raises:
            ConfigError: Naming the factor to apply to the schedule by hand.
        """
        if scheduled and not self.active and self.warmup_epochs:
            raise ConfigError(
                f"warmup_epochs={self.warmup_epochs:g} ramps the learning rate, but this "
                "model's comes from a LearningRateSchedule (or a callable): put the "
                "warm-up in the schedule and drop warmup_epochs, or compile with a float "
                "learning rate."
            )
        if self.active and scheduled:
            raise ConfigError(
                "lr_scaling scales the optimizer's learning rate, but this model's is a "
                "LearningRateSchedule. Scale the schedule's rates by the "
                f"factor yourself ({self.factor:g} here) and drop lr_scaling and "
                "warmup_epochs, or compile with a float learning rate."
            )


def resolve_scaling(
    scaling: str | None, optimizer: str, *, synchronous: bool = False
) -> str | None:
    """``lr_scaling`` with ``"auto"`` resolved for the model's optimizer kind and
    whether pushes merge in barrier rounds (:data:`AUTO_SYNCHRONOUS`, else :data:`AUTO`).

    Raises:
        ConfigError: ``optimizer`` is not one of :data:`OPTIMIZER_KINDS`.

    Example:
        >>> resolve_scaling("auto", "adaptive"), resolve_scaling("linear", "adaptive")
        ('sqrt', 'linear')
        >>> resolve_scaling("auto", "adaptive", synchronous=True)
        'linear'
    """
    if optimizer not in OPTIMIZER_KINDS:
        raise ConfigError(
            f"Expected the optimizer kind to be one of {OPTIMIZER_KINDS}. Received: {optimizer!r}"
        )
    if scaling != "auto":
        return scaling
    return (AUTO_SYNCHRONOUS if synchronous else AUTO)[optimizer]


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
            "set lr_scaling='auto', 'linear' (SGD) or 'sqrt' (adaptive optimizers) too."
        )
