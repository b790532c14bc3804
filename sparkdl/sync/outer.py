"""Outer optimizers: the service treats what a merge moves as a gradient and steps on it.

SlowMo (Wang et al., ICLR 2020) and DiLoCo (Douillard et al., 2023) keep the workers'
optimizer as it is (the *inner* one) and give the center an optimizer of its own. The
change a merge would make to the center is a *pseudo-gradient*, ``g = center -
merged``, and the outer optimizer steps on it with its own learning rate and momentum:

* ``"sgd"``: heavy-ball momentum, SlowMo's rule: ``m = mu m + g``, ``center -= lr m``;
* ``"nesterov"``: DiLoCo's rule (PyTorch's Nesterov SGD): ``m = mu m + g``,
  ``center -= lr (g + mu m)``;
* ``"model"``: the model's own compiled Keras optimizer (:class:`ModelOptimizerState`).
  Workers then take plain gradient steps (``SGD``, rate 1) and sync every batch, so a
  round's pseudo-gradient is the global batch's mean gradient and the center takes one
  step of the user's optimizer on it: the one-process fit at a batch of ``batch_size x
  num_workers`` (the rule of synchronous data-parallel training, Horovod's). An adaptive
  optimizer (Adam, RMSprop) normalises that one gradient by its own moments; averaging
  the workers' own Adam steps instead normalises each worker's noisier gradient, which
  left 2-worker fits on digits 0.7-1.0 points behind plain Keras
  (``docs/benchmarks/parity.md``).

``lr = 1`` with ``mu = 0`` is the merge itself: :meth:`OuterState.round` then returns the
merge's result untouched, so those weights are exactly today's.

**Synchronous mode** steps once per round on the round's pseudo-gradient, as SlowMo and
DiLoCo do (a round every ``frequency`` batches is their ``H`` inner steps).

**Asynchronous modes** see one worker's push at a time. Applying momentum to every push
compounds it with the staleness asynchrony already adds; Liu et al. (2024,
"Asynchronous Local-SGD Training for Language Modeling") found outer Nesterov unstable
there and proposed *Delayed Nesterov*: the momentum buffer changes only once every N
pushes, and in between each push is applied as a plain gradient step. sparkdl follows
that with N = ``num_workers`` (about one synchronous round's worth of pushes): every
push moves the center by ``-lr g``, the pushes' pseudo-gradients add up in ``acc``, and
every N-th push also updates ``m = mu m + acc`` and adds the momentum's part of a round's
step (``-lr mu m`` for Nesterov, ``-lr mu m_old`` for heavy ball), so N pushes move the
center as one synchronous outer step on their sum would. Hogwild takes the same step
outside the lock (its races included).

The state (``m``, ``acc``, the pushes since the last buffer update) lives beside the
center in each store, so a sharded service keeps it per shard; checkpoints and the
cluster's snapshots carry it (:meth:`OuterState.arrays`).

Example:
    >>> import numpy as np
    >>> outer = OuterOptimizer("nesterov", learning_rate=0.5, momentum=0.9)
    >>> state = outer.state([np.zeros(2, np.float32)], num_workers=1)
    >>> state.round([np.zeros(2, np.float32)], [np.ones(2, np.float32)])[0].tolist()
    [0.949999988079071, 0.949999988079071]
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparkdl.errors import ConfigError
from sparkdl.sync.merges import is_float
from sparkdl.sync.settings import FitSettings

__all__ = [
    "DEFAULT_LEARNING_RATE",
    "DEFAULT_MOMENTUM",
    "OUTER_OPTIMIZERS",
    "OuterOptimizer",
    "OuterState",
]

#: ``outer_optimizer`` values (``None``: no outer optimizer).
OUTER_OPTIMIZERS: tuple[str, ...] = ("sgd", "nesterov", "model")
#: The value that steps the center with the model's own compiled optimizer.
MODEL = "model"
#: DiLoCo's outer learning rate and momentum (Douillard et al. 2023).
DEFAULT_LEARNING_RATE = 0.7
DEFAULT_MOMENTUM = 0.9


@dataclass(frozen=True)
class OuterOptimizer:
    """An outer optimizer's settings, resolved once on the driver.

    Args:
        kind: ``"sgd"`` (heavy-ball momentum, SlowMo), ``"nesterov"`` (DiLoCo) or
            ``"model"`` (the model's compiled optimizer).
        learning_rate: The outer learning rate, > 0 (``"model"``: unused, 1).
        momentum: The outer momentum, in [0, 1) (``"model"``: unused, 0).
        config: ``"model"``: the compiled optimizer, Keras-serialized as JSON.
        trainable: ``"model"``: which of the model's weights (in the center's order)
            the optimizer steps; the others take the merge's result (BatchNorm's
            moving statistics are averaged).
        rate_factor: ``"model"``: the learning-rate recipe's factor on the compiled
            rate (:mod:`sparkdl.sync.recipe`; the workers' own rate is then 1).
        paths: ``"model"``: the model's weight paths (in the center's order), which
            the optimizer's copies of the weights take: an optimizer may treat a
            weight by its layer (``Muon``'s ``exclude_layers``, its embeddings).
    """

    kind: str
    learning_rate: float = DEFAULT_LEARNING_RATE
    momentum: float = DEFAULT_MOMENTUM
    config: str = field(default="", repr=False)
    trainable: tuple[bool, ...] = field(default=(), repr=False)
    rate_factor: float = 1.0
    paths: tuple[str, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        check(self.kind, self.learning_rate, self.momentum)

    @classmethod
    def resolve(cls, settings: FitSettings) -> OuterOptimizer:
        """The optimizer ``settings.outer_optimizer`` names, DiLoCo's learning rate and
        momentum where ``outer_learning_rate`` or ``outer_momentum`` is ``None``.

        Example:
            >>> OuterOptimizer.resolve(FitSettings(
            ...     {"outer_optimizer": "sgd", "outer_learning_rate": None, "outer_momentum": 0.5}))
            OuterOptimizer(kind='sgd', learning_rate=0.7, momentum=0.5, rate_factor=1.0)
        """
        rate, momentum = settings.outer_learning_rate, settings.outer_momentum
        if settings.outer_optimizer == MODEL:  # its rate is the model's (of_model)
            return cls(MODEL, learning_rate=1.0, momentum=0.0)
        return cls(
            settings.outer_optimizer,
            learning_rate=DEFAULT_LEARNING_RATE if rate is None else rate,
            momentum=DEFAULT_MOMENTUM if momentum is None else momentum,
        )

    def of_model(
        self,
        config: str,
        trainable: tuple[bool, ...],
        rate_factor: float,
        paths: tuple[str, ...] = (),
    ) -> OuterOptimizer:
        """``"model"`` resolved for one model: its compiled optimizer (serialized), which
        of its weights are trainable, the recipe's factor on its rate, and its weights'
        paths."""
        return dataclasses.replace(
            self,
            config=config,
            trainable=tuple(trainable),
            rate_factor=float(rate_factor),
            paths=tuple(paths),
        )

    @property
    def identity(self) -> bool:
        """Whether the outer step is the merge itself (``lr = 1``, no momentum)."""
        return self.kind != MODEL and self.learning_rate == 1.0 and self.momentum == 0.0

    @property
    def steps_model(self) -> bool:
        """Whether the model's compiled optimizer steps the center (``"model"``): the
        workers then take plain gradient steps at rate 1."""
        return self.kind == MODEL

    def describe(self) -> str:
        """The resolved optimizer, in words.

        Example:
            >>> OuterOptimizer("nesterov").describe()
            'nesterov, learning rate 0.7, momentum 0.9'
        """
        if self.kind == MODEL:
            name = json.loads(self.config).get("class_name", "?") if self.config else "?"
            return (
                f"the model's {name} on each round's mean gradient (workers step with "
                f"SGD at rate 1), its learning rate x {self.rate_factor:g}"
            )
        return f"{self.kind}, learning rate {self.learning_rate:g}, momentum {self.momentum:g}"

    def state_shapes(self, weights: Sequence[Any]) -> list[tuple[int, ...]]:
        """The shapes of :meth:`OuterState.arrays` for a model of ``weights`` (a saved
        state that differs was written from another model).

        Example:
            >>> OuterOptimizer("sgd").state_shapes([np.zeros((2, 3))])
            [(2, 3), (2, 3)]
        """
        if self.kind == MODEL:
            zeros = [np.zeros(tuple(w.shape), np.float32) for w in weights]
            fresh = ModelOptimizerState(self, zeros)
            return [tuple(a.shape) for a in fresh.arrays()]
        return [tuple(w.shape) for w in weights] * 2

    def state(
        self,
        center: Sequence[np.ndarray],
        *,
        num_workers: int,
        arrays: Sequence[np.ndarray] | None = None,
        pushes: int = 0,
        compile: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
    ) -> OuterState:
        """A fresh state for a center shaped like ``center`` (or one restored from a
        checkpoint's :meth:`OuterState.arrays` and push count); ``compile`` compiles
        ``"model"``'s step for the backend
        (:func:`sparkdl.contract.backends.compiled`)."""
        if self.kind == MODEL:
            return ModelOptimizerState(self, center, arrays=arrays, pushes=pushes, compile=compile)
        return OuterState(self, center, num_workers=num_workers, arrays=arrays, pushes=pushes)


class OuterState:
    """One store's outer optimizer state: the momentum buffer and, in asynchronous
    modes, the pseudo-gradients since the buffer's last update.

    Its own lock guards the buffers and the push count (the store calls it under its
    lock, except hogwild's steps, which run outside it).
    """

    def __init__(
        self,
        optimizer: OuterOptimizer,
        center: Sequence[np.ndarray],
        *,
        num_workers: int,
        arrays: Sequence[np.ndarray] | None = None,
        pushes: int = 0,
    ) -> None:
        self.optimizer = optimizer
        self.period = max(int(num_workers), 1)
        # Shaped like the weights (unused for integer ones); 16-bit weights step in
        # float32, so a pseudo-gradient never overflows where the result would fit.
        shapes = [np.zeros(c.shape, _work_dtype(c)) for c in center]
        if arrays is not None:
            if len(arrays) != 2 * len(shapes) or any(
                np.shape(a) != np.shape(s) for a, s in zip(arrays, shapes + shapes, strict=True)
            ):
                raise ValueError(
                    "The outer optimizer's saved state does not match the model's weights: "
                    "resume with the model the checkpoint was written from."
                )
            half = len(shapes)
            self.momentum = [
                np.array(a, dtype=s.dtype) for a, s in zip(arrays[:half], shapes, strict=True)
            ]
            self.accumulated = [
                np.array(a, dtype=s.dtype) for a, s in zip(arrays[half:], shapes, strict=True)
            ]
        else:
            self.momentum = shapes
            self.accumulated = [np.zeros_like(s) for s in shapes]
        self.pushes = int(pushes)
        self._lock = threading.Lock()

    # ------------------------------------------------------------ synchronous
    def round(
        self,
        center: Sequence[np.ndarray],
        merged: list[np.ndarray],
        check: Callable[[list[np.ndarray]], None] | None = None,
    ) -> list[np.ndarray]:
        """The center after one synchronous round whose merge gave ``merged``.

        ``check`` sees the new center first and may refuse it (raise): the state then
        stays as it was.
        """
        opt = self.optimizer
        if opt.identity:
            return merged
        lr, mu = opt.learning_rate, opt.momentum
        out: list[np.ndarray] = []
        buffers: dict[int, np.ndarray] = {}
        # An overflow becomes inf, which ``check`` refuses (Center.outer_magnitudes).
        with self._lock, np.errstate(over="ignore", invalid="ignore"):
            for i, (c, new, m) in enumerate(zip(center, merged, self.momentum, strict=True)):
                if not is_float(c):
                    out.append(new)
                    continue
                base = c.astype(m.dtype, copy=False)
                g = base - new.astype(m.dtype, copy=False)
                if mu:
                    buffers[i] = m * m.dtype.type(mu) + g
                    update = (
                        g + buffers[i] * m.dtype.type(mu) if opt.kind == "nesterov" else buffers[i]
                    )
                else:
                    update = g
                out.append((base - update * m.dtype.type(lr)).astype(c.dtype, copy=False))
            if check is not None:
                check(out)
            for i, buffer in buffers.items():
                self.momentum[i] = buffer
        return out

    # ----------------------------------------------------------- asynchronous
    def push_steps(
        self,
        center: Sequence[np.ndarray],
        after: Sequence[np.ndarray],
        check: Callable[[list[np.ndarray]], None] | None = None,
    ) -> tuple[list[np.ndarray | None], list[np.ndarray]]:
        """One asynchronous push whose merge gave ``after`` (Delayed Nesterov: module
        docstring): what to add to ``center`` (``None`` for an array the merge
        replaced: integer state, take ``after``'s) and the new center.

        ``check`` sees the new center first and may refuse it (raise): the state then
        stays as it was.
        """
        opt = self.optimizer
        lr, mu = opt.learning_rate, opt.momentum
        steps: list[np.ndarray | None] = []
        trial: list[np.ndarray] = []
        sums: dict[int, np.ndarray] = {}
        buffers: dict[int, np.ndarray] = {}
        with self._lock, np.errstate(over="ignore", invalid="ignore"):
            pushes = self.pushes + 1
            closing = pushes % self.period == 0
            for i, (c, new, m, acc) in enumerate(
                zip(center, after, self.momentum, self.accumulated, strict=True)
            ):
                if not is_float(c):
                    steps.append(None)
                    trial.append(new)
                    continue
                kind = m.dtype.type
                base = c.astype(m.dtype, copy=False)
                g = base - new.astype(m.dtype, copy=False)
                step = g * kind(-lr)
                if mu:
                    total = acc + g
                    if closing:
                        buffers[i] = m * kind(mu) + total
                        # The momentum's part of a round's step (the pushes took lr x
                        # their sum): Nesterov's mu m_new, heavy ball's mu m_old.
                        held = buffers[i] if opt.kind == "nesterov" else m
                        step = step - held * kind(mu * lr)
                        total = np.zeros_like(total)
                    sums[i] = total
                steps.append(step)
                trial.append((base + step).astype(c.dtype, copy=False))
            if check is not None:
                check(trial)
            self.pushes = pushes
            for i, total in sums.items():
                self.accumulated[i] = total
            for i, buffer in buffers.items():
                self.momentum[i] = buffer
        return steps, trial

    def apply_push(
        self,
        center: Sequence[np.ndarray],
        after: list[np.ndarray],
        check: Callable[[list[np.ndarray]], None] | None = None,
    ) -> list[np.ndarray]:
        """The new center (new arrays) after one asynchronous push whose merge gave
        ``after`` (``check``: as :meth:`push_steps`)."""
        if self.optimizer.identity:
            return after
        return self.push_steps(center, after, check)[1]

    def set_learning_rate(self, rate: float) -> None:
        """The model's rate changed on the driver: the workers' own rate carries it; an
        outer step of its own rate stays as it is."""

    # -------------------------------------------------------------- checkpoint
    def arrays(self) -> list[np.ndarray]:
        """The state as arrays shaped like the weights: the momentum buffers, then the
        accumulated pseudo-gradients (zeros for integer weights; float32 for 16-bit
        weights)."""
        with self._lock:
            return [np.array(a) for a in self.momentum + self.accumulated]

    def snapshot(self) -> tuple[list[np.ndarray], int]:
        """:meth:`arrays` and the push count, taken together."""
        with self._lock:
            return [np.array(a) for a in self.momentum + self.accumulated], self.pushes


class ModelOptimizerState(OuterState):
    """The model's compiled Keras optimizer beside one store's center
    (``outer_optimizer="model"``, synchronous rounds only).

    Each round the merge's result is the center less the round's mean gradient (the
    workers stepped with ``SGD`` at rate 1 from the center), so ``center - merged`` is
    that gradient; the optimizer, built once over Keras variables that mirror the
    trainable weights, applies it as ``model.fit`` would (clipping, weight decay and
    schedules included: one optimizer step per round). Other weights (BatchNorm's
    moving statistics, integer state) take the merge's result. The state's arrays are
    the optimizer's variables (its step count and rate first, then its slots), which
    checkpoints and the cluster's snapshots carry.
    """

    def __init__(
        self,
        optimizer: OuterOptimizer,
        center: Sequence[np.ndarray],
        *,
        arrays: Sequence[np.ndarray] | None = None,
        pushes: int = 0,
        compile: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
    ) -> None:
        import keras  # the service's side of a fit that already runs Keras

        self._keras_ops = keras.ops
        self.optimizer = optimizer
        self.period = 1
        self.momentum, self.accumulated = [], []  # unused: the Keras optimizer holds them
        self.pushes = int(pushes)
        self._lock = threading.Lock()
        flags = optimizer.trainable or (True,) * len(center)
        self._index = [i for i, c in enumerate(center) if flags[i] and is_float(c)]
        config = json.loads(optimizer.config)
        # The workers' plain steps scale no loss, so nothing is there to unscale.
        config.get("config", {}).pop("loss_scale_factor", None)
        self._keras = keras.optimizers.deserialize(config)
        paths = optimizer.paths or tuple(f"weight_{i}" for i in range(len(center)))
        self._variables = [_mirror(center[i], paths[i]) for i in self._index]
        self._keras.build(self._variables)
        #: One step: the center's values in, the optimizer applied, the new values out
        #: (compiled where the backend pays per operation: ``compile``).
        self._step = (compile or (lambda f: f))(self._apply)
        self.base_rate = _fixed_rate(config)
        if arrays is not None:
            self._restore(arrays)
        if self.base_rate is not None:  # a restored rate was scaled for other workers
            self._keras.learning_rate = self.base_rate * optimizer.rate_factor

    def _restore(self, arrays: Sequence[np.ndarray]) -> None:
        held = self._keras.variables
        if len(arrays) != len(held) or any(
            tuple(np.shape(a)) != tuple(v.shape) for a, v in zip(arrays, held, strict=True)
        ):
            raise ValueError(
                "The outer optimizer's saved state does not match the model's weights: "
                "resume with the model the checkpoint was written from."
            )
        for variable, array in zip(held, arrays, strict=True):
            variable.assign(np.asarray(array, dtype=variable.dtype))

    def set_learning_rate(self, rate: float) -> None:
        """The model's rate changed on the driver (``ReduceLROnPlateau``): the center
        steps at it times the recipe's factor from the next round."""
        with self._lock:
            self.base_rate = float(rate)
            self._keras.learning_rate = self.base_rate * self.optimizer.rate_factor

    def round(
        self,
        center: Sequence[np.ndarray],
        merged: list[np.ndarray],
        check: Callable[[list[np.ndarray]], None] | None = None,
    ) -> list[np.ndarray]:
        """The center after one optimizer step on the round's mean gradient (``check``
        may refuse the result: the optimizer's state then stays as it was)."""
        with self._lock, np.errstate(over="ignore", invalid="ignore"):
            bases, grads = [], []
            for variable, i in zip(self._variables, self._index, strict=True):
                base = np.asarray(center[i], dtype=variable.dtype)
                bases.append(base)  # the center as it is (a resumed or reset one too)
                grads.append(base - np.asarray(merged[i], dtype=variable.dtype))
            if not any(np.any(g) for g in grads):
                # Every worker skipped its step (a loss scale's overflow): Keras's
                # optimizer takes none either.
                return list(merged)
            before = self._values() if check is not None else []  # to undo a refusal
            stepped = self._step(bases, grads)
            out = list(merged)
            for value, i in zip(stepped, self._index, strict=True):
                out[i] = self._keras_ops.convert_to_numpy(value).astype(center[i].dtype)
            if check is not None:
                try:
                    check(out)
                except BaseException:
                    for variable, array in zip(self._keras.variables, before, strict=True):
                        variable.assign(array)
                    raise
        return out

    def _apply(self, bases: list[Any], grads: list[Any]) -> list[Any]:
        """Sets the mirrors to ``bases``, applies ``grads``, returns the new values."""
        for variable, base in zip(self._variables, bases, strict=True):
            variable.assign(base)
        tensors = [self._keras_ops.convert_to_tensor(g) for g in grads]  # (PyTorch's needs)
        self._keras.apply(tensors, self._variables)
        return [variable.value for variable in self._variables]

    def _values(self) -> list[np.ndarray]:
        """The optimizer's variables as arrays, in its order."""
        return [self._keras_ops.convert_to_numpy(v) for v in self._keras.variables]

    def push_steps(
        self,
        center: Sequence[np.ndarray],
        after: Sequence[np.ndarray],
        check: Callable[[list[np.ndarray]], None] | None = None,
    ) -> tuple[list[np.ndarray | None], list[np.ndarray]]:
        """Refused: the model's optimizer steps on synchronous rounds only (the
        settings' check says so before a fit starts)."""
        raise ConfigError("outer_optimizer='model' needs mode='synchronous'.")

    def arrays(self) -> list[np.ndarray]:
        """The optimizer's variables, in its order."""
        with self._lock:
            return self._values()

    def snapshot(self) -> tuple[list[np.ndarray], int]:
        """:meth:`arrays` and the push count, taken together."""
        with self._lock:
            return self._values(), self.pushes


def _mirror(value: np.ndarray, path: str) -> Any:
    """A Keras variable holding ``value`` (in the dtype an outer step computes in) at
    the model weight's ``path``, so that the optimizer sees the layer it belongs to.

    Example:
        >>> _mirror(np.zeros(2, np.float32), "encoder/dense/kernel").path
        'encoder/dense/kernel'
    """
    import keras

    *scopes, name = path.split("/")
    with contextlib.ExitStack() as stack:
        for depth, scope in enumerate(scopes):  # from the root, whatever scope is open
            stack.enter_context(keras.name_scope(scope, override_parent="" if depth == 0 else None))
        return keras.Variable(np.asarray(value, _work_dtype(value)), name=name)


def _fixed_rate(config: dict[str, Any]) -> float | None:
    """The learning rate of a serialized Keras optimizer, or ``None`` when a schedule
    (serialized as a dict) gives it.

    Example:
        >>> _fixed_rate({"config": {"learning_rate": 0.001}})
        0.001
    """
    rate = config.get("config", {}).get("learning_rate")
    return float(rate) if isinstance(rate, (int, float)) else None


def _work_dtype(array: np.ndarray) -> np.dtype[Any]:
    """The dtype an outer step of ``array`` computes in: float32 for 16-bit floats."""
    if is_float(array) and array.dtype.itemsize < 4:
        return np.dtype(np.float32)
    return array.dtype


def check(kind: str | None, learning_rate: float | None, momentum: float | None) -> None:
    """Checks the outer optimizer's settings.

    Raises:
        ConfigError: An unknown optimizer, a learning rate <= 0 or not finite, a
            momentum outside [0, 1).
    """
    if kind is not None and kind not in OUTER_OPTIMIZERS:
        raise ConfigError(
            f"Expected outer_optimizer to be None or one of {OUTER_OPTIMIZERS}. "
            f"Received: outer_optimizer={kind!r}"
        )
    if learning_rate is not None and (
        isinstance(learning_rate, bool)
        or not isinstance(learning_rate, (int, float))
        or not math.isfinite(learning_rate)
        or learning_rate <= 0
    ):
        raise ConfigError(
            "Expected outer_learning_rate to be a finite number > 0 (DiLoCo uses 0.7). "
            f"Received: outer_learning_rate={learning_rate!r}"
        )
    if momentum is not None and (
        isinstance(momentum, bool)
        or not isinstance(momentum, (int, float))
        or not 0 <= momentum < 1
    ):
        raise ConfigError(
            "Expected outer_momentum to be a number in [0, 1) (DiLoCo uses 0.9). "
            f"Received: outer_momentum={momentum!r}"
        )
