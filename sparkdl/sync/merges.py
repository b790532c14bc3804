"""Merges: what a worker pushes and how the service combines it, one class per rule.

A merge is a frozen dataclass holding its resolved settings; the driver builds it once
(:meth:`Merge.resolve`), the service and every worker use the same object. It has two
halves:

* **worker half**: :meth:`~Merge.outgoing` (what to push, given the local weights and
  the center the worker last received), :meth:`~Merge.moved` (the local weights right
  after a push the worker does not wait for), :meth:`~Merge.incoming` (the local
  weights once the answer arrives) and :meth:`~Merge.settle` (the same for an answer
  that arrives while the worker trained on: ``overlap``).
* **service half**: :meth:`~Merge.combine` (a synchronous round), :meth:`~Merge.apply`
  (one asynchronous push under the lock, as new arrays, so a version once made never
  changes and is sent without copying) and :meth:`~Merge.apply_in_place` (hogwild: into
  the live center with no lock held).

=========  ================================  ==========================================
merge      worker pushes                     service
=========  ================================  ==========================================
average    synchronous: its weights ``w``;   synchronous: mean weighted by samples;
           asynchronous: ``w - c_seen``      asynchronous: ``c += (w - c_seen) / n``
delta      ``scale * (w - c_seen)``          synchronous: ``c +=`` the mean delta
                                             weighted by samples; asynchronous:
                                             ``c += d`` (or ``d / k`` for a delta k
                                             versions old)
elastic    ``d = alpha * (w - c_seen)``      ``c += d``, summed over the round when
           and moves ``w -= d``              synchronous (Sync EASGD)
=========  ================================  ==========================================

Integer weights (counters, seed states) are never averaged or added: a worker pushes
them as they are, a synchronous round keeps the first worker's value and an
asynchronous push's value replaces the center's.

A new rule is one subclass decorated with :func:`register`
(``merge_class(name)`` finds it); no route, store or worker
code names a merge.

Example:
    >>> import numpy as np
    >>> ups = [Update(worker=0, arrays=[np.array([0.0])], samples=1),
    ...        Update(worker=1, arrays=[np.array([4.0])], samples=3)]
    >>> Average().combine([np.array([9.0])], ups)[0].tolist()
    [3.0]
    >>> elastic = Elastic(alpha=0.5)
    >>> push = elastic.outgoing([np.full(2, 4.0)], center=[np.zeros(2)])
    >>> push[0].tolist(), elastic.moved([np.full(2, 4.0)], push)[0].tolist()
    ([2.0, 2.0], [2.0, 2.0])
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from sparkdl.errors import ConfigError
from sparkdl.sync.registry import Registry
from sparkdl.sync.settings import FitSettings

__all__ = [
    "MERGES",
    "STALENESS",
    "Average",
    "Delta",
    "Elastic",
    "Merge",
    "Update",
    "float_limit",
    "is_float",
    "merge_class",
    "register",
]

#: How an asynchronous delta is scaled by its age (:class:`Delta`).
STALENESS: tuple[str, ...] = ("none", "inverse")
#: ``elastic_alpha`` when none is given is this divided by the number of workers.
ELASTIC_BETA = 0.9

Arrays = Sequence[np.ndarray]

_log = logging.getLogger(__name__)


@dataclass
class Update:
    """One worker's push, as the service sees it.

    Args:
        worker: Worker id (the Spark partition id).
        arrays: The pushed arrays, in the model's weight order.
        samples: Samples the worker trained on since its previous push.
        base_version: Center version the worker computed the push against.
        meta: The rest of the message's metadata.
        magnitudes: Each array's largest absolute value (the service's overflow
            check, :meth:`sparkdl.server.state.center.Center.reserve`).
    """

    worker: int
    arrays: list[np.ndarray]
    samples: int
    base_version: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    magnitudes: list[float] = field(default_factory=list)


def is_float(array: np.ndarray) -> bool:
    """Whether ``array`` holds floating-point values (weights that merges move).

    ``bfloat16`` (ml_dtypes, Keras's mixed precision) counts: numpy does not file it
    under ``np.floating``.

    Example:
        >>> import ml_dtypes
        >>> is_float(np.zeros(1, ml_dtypes.bfloat16)), is_float(np.zeros(1, np.int64))
        (True, False)
    """
    dtype = array.dtype
    return bool(np.issubdtype(dtype, np.floating)) or dtype.name == "bfloat16"


def float_limit(dtype: Any) -> float:
    """The largest finite value of a floating-point dtype (``bfloat16`` included).

    Example:
        >>> float_limit(np.float16)
        65504.0
    """
    import ml_dtypes  # a dependency of Keras; only the service's bounds need it

    return float(ml_dtypes.finfo(dtype).max)


class Merge(abc.ABC):
    """A merge rule: both halves. Subclasses are frozen dataclasses of their settings."""

    #: The name users pass as ``merge=``.
    name: ClassVar[str] = ""
    #: Whether what a compressed push's encoding left out goes back into the worker's
    #: weights with the answer (error feedback). Elastic averaging needs none: a worker
    #: moves by what the center received, and the rest stays in its next difference.
    error_feedback: ClassVar[bool] = True
    #: Whether an outer optimizer (:mod:`sparkdl.sync.outer`) may step on the change
    #: this merge makes: a mean of the workers' progress. Off unless a merge says so
    #: (``average`` and ``delta`` do); elastic averaging has an outer step of its own
    #: (``alpha``).
    supports_outer_optimizer: ClassVar[bool] = False

    @property
    def pushes_weights(self) -> bool:
        """Whether a worker pushes its weights, not a difference to the center it holds.
        Compression takes differences only (:mod:`sparkdl.server.state.replicas`): a merge
        pushing weights has a relative form for it (:attr:`Average.relative`)."""
        return False

    def lr_factor(self, num_workers: int, synchronous: bool) -> float:
        """How many times farther one process would move the weights than this merge's
        center moves, over the same samples at the same learning rate: the factor
        ``lr_scaling="linear"`` multiplies the rate by (:mod:`sparkdl.sync.recipe`).

        Merges that average n workers' steps into one step of the center say n; deltas
        added in full say 1 (this default: a merge that does not say is not scaled);
        elastic averaging says ``n + 1``.
        """
        return 1.0

    def describe(self, synchronous: bool) -> str:
        """What this merge resolved to, in words, for the fit's start (its factors and
        scales and where they come from); ``""`` when it has nothing to say.

        Example:
            >>> Elastic(alpha=0.45).describe(synchronous=True)
            'alpha 0.45'
        """
        return ""

    @property
    def additive(self) -> bool:
        """Whether the service adds what is pushed (deltas, elastic differences), so the
        center can grow by the pushes' magnitudes; an average of weights stays within
        the largest value pushed (the service's overflow check, ``Center.reserve``)."""
        return True

    @classmethod
    @abc.abstractmethod
    def resolve(cls, settings: FitSettings) -> Merge:
        """The merge with its settings resolved for one fit (on the driver).

        Args:
            settings: The fit's settings and facts (:mod:`sparkdl.sync.settings`):
                ``num_workers``, ``synchronous``, ``whole_epoch`` and the settings the
                merge reads by name.
        """

    # ------------------------------------------------------------ worker half
    def outgoing(self, local: Arrays, center: Arrays) -> list[np.ndarray]:
        """What to push, given the local weights and the center last received."""
        return list(local)

    def moved(self, local: list[np.ndarray], pushed: Arrays) -> list[np.ndarray]:
        """The local weights right after a push the worker does not wait for.

        ``local`` itself when the push moves nothing (``moved(l, p) is l``).
        """
        return local

    def incoming(self, local: Arrays, pushed: Arrays, answer: Arrays) -> list[np.ndarray]:
        """The local weights once the service answered ``pushed`` with its center."""
        return list(answer)

    def settle(self, local: Arrays, at_push: Arrays, answer: Arrays) -> list[np.ndarray]:
        """The local weights once the answer to an earlier push arrives (overlap).

        Args:
            local: The weights now.
            at_push: The weights right after the push (what :meth:`moved` returned).
            answer: The service's center in its answer.

        By default the worker continues from the center plus what it learned since the
        push (``answer + local - at_push``), so every step is pushed exactly once.
        """
        return [
            c + (w - p) if is_float(c) else c
            for w, p, c in zip(local, at_push, answer, strict=True)
        ]

    def unsent_weights(self, unsent: np.ndarray) -> np.ndarray:
        """The change of the local weights that makes the next push carry ``unsent``
        (a compressed push's part its encoding left out)."""
        return unsent

    # ----------------------------------------------------------- service half
    @abc.abstractmethod
    def combine(self, center: Arrays, updates: Sequence[Update]) -> list[np.ndarray]:
        """The new center after a synchronous round (one push per worker)."""

    def apply(self, center: Arrays, update: Update, version: int) -> list[np.ndarray]:
        """The center after one asynchronous push, as new arrays (``center`` is kept).

        Args:
            center: The current center weights.
            update: The push.
            version: The center's version before this update.
        """
        out = [np.array(c, copy=True) for c in center]
        self.apply_in_place(out, update, version)
        return out

    def apply_in_place(self, center: list[np.ndarray], update: Update, version: int) -> None:
        """Folds one push into the live ``center`` (hogwild: no lock is held)."""
        for c, d in zip(center, update.arrays, strict=True):
            if is_float(c):
                self._step(c, d, update, version)
            else:
                c[...] = d  # integer state: the newest value wins

    @abc.abstractmethod
    def _step(self, center: np.ndarray, pushed: np.ndarray, update: Update, version: int) -> None:
        """Moves one floating-point center array in place."""


#: Every merge by name; ``@MERGES.register`` (or :func:`register`) adds one.
MERGES: Registry[type[Merge]] = Registry("merge")
register = MERGES.register
merge_class = MERGES.get


@register
@dataclass(frozen=True)
class Average(Merge):
    """Model averaging.

    Synchronously, the mean of the pushed weights weighted by samples seen; workers that
    trained on no samples in the round (a short partition that finished its epoch) weigh
    nothing, and if no worker trained the plain mean is taken. Asynchronously, each push
    moves the center by ``share`` (``1 / num_workers``) of what the worker learned since
    the center it last received: each worker owns its share of a running average.

    Asynchronous pushes are differences (``relative``): moving the center ``share`` of
    the way to the pushed weights, as a running average of weights would, also moves it
    ``share`` of the way back to the older center those weights were trained from, and
    the staler the push the more the center loses (on digits with hogwild, 0.8 points
    of accuracy against one process).

    Attributes:
        share: An asynchronous push's share of the center (``1 / num_workers``).
        relative: Pushes are differences to the copy of the center each worker holds
            (asynchronous modes, and under compression, where averaging the workers'
            copies back in would drop, every round, what lossy answers have not
            delivered yet). Synchronously the center moves by their sample-weighted mean
            (a difference with no samples, held-back residue, at ``1 / workers``),
            asynchronously by ``share`` times each.
    """

    name: ClassVar[str] = "average"
    supports_outer_optimizer: ClassVar[bool] = True
    share: float = 1.0
    relative: bool = False

    @classmethod
    def resolve(cls, settings: FitSettings) -> Average:
        compressed = getattr(settings, "compression", None) is not None
        relative = not settings.synchronous or compressed
        return cls(share=1.0 / max(settings.num_workers, 1), relative=relative)

    @property
    def pushes_weights(self) -> bool:
        return not self.relative

    @property
    def additive(self) -> bool:
        return self.relative

    def lr_factor(self, num_workers: int, synchronous: bool) -> float:
        return 1.0 / self.share

    def describe(self, synchronous: bool) -> str:
        if synchronous:
            how = "the round's weights averaged, weighted by samples"
            return how + (" (as differences: compression)" if self.relative else "")
        return f"each push moves the center {self.share:.3g} of the way (1/num_workers)"

    def outgoing(self, local: Arrays, center: Arrays) -> list[np.ndarray]:
        if not self.relative:
            return list(local)
        return [w - c if is_float(w) else w for w, c in zip(local, center, strict=True)]

    def combine(self, center: Arrays, updates: Sequence[Update]) -> list[np.ndarray]:
        if not updates:
            return [np.array(c, copy=True) for c in center]
        weights = np.array([max(u.samples, 0) for u in updates], dtype=np.float64)
        # A relative push with no samples is what an encoding held back earlier (a
        # padding round, a closing push after the epoch's samples were sent): it is
        # added at one worker's share rather than dropped.
        residue: list[Update] = []
        if weights.sum() <= 0:
            weights = np.ones(len(updates))
        elif self.relative:
            residue = [u for u in updates if u.samples <= 0]
        weights /= weights.sum()
        merged = []
        for i, ref in enumerate(center):
            if not is_float(ref):
                merged.append(np.array(updates[0].arrays[i], dtype=ref.dtype))
                continue
            acc = np.zeros(ref.shape, dtype=np.result_type(ref.dtype, np.float32))
            if self.relative:
                acc += ref  # the weighted mean of the differences, onto the center
            for w, update in zip(weights, updates, strict=True):
                if w:
                    acc += update.arrays[i] * acc.dtype.type(w)
            for update in residue:
                acc += update.arrays[i] * acc.dtype.type(1.0 / len(updates))
            merged.append(acc.astype(ref.dtype, copy=False))
        return merged

    def _step(self, center: np.ndarray, pushed: np.ndarray, update: Update, version: int) -> None:
        if update.samples <= 0 and not self.relative:
            return  # a worker that trained on nothing only reports
        share = center.dtype.type(self.share)
        if not self.relative:
            center *= center.dtype.type(1.0) - share
        center += pushed * share


@register
@dataclass(frozen=True)
class Delta(Merge):
    """Adds pushed deltas (``scale * (w - w_pulled)``, Downpour) to the center.

    Asynchronously, each delta is added as it arrives. With ``staleness="inverse"`` a
    delta computed against a center ``k >= 2`` versions old is scaled by ``1 / k``
    (staleness-aware async SGD, Zhang et al. 2016); a fresher one is added as is. In a
    synchronous round the deltas are averaged, weighted by samples, which is the same
    step model averaging takes.

    ``scale``: asynchronous deltas default to ``1 / num_workers``, and the learning-rate
    recipe (``lr_scaling``, on by default) multiplies the workers' rate by
    ``num_workers`` (SGD) or its square root (adaptive optimizers) to make up for it.
    With plain SGD that moves the center as textbook Downpour does (scale 1 at the
    model's rate); with Adam it damps the momentum asynchrony adds (Mitliagkas et al.
    2016): Downpour at scale 1 ended 3-6 points below one process on the teacher
    workload at a push every 16 batches, and 0.6-0.8 points on digits. Without the
    recipe (``lr_scaling=None``) the default is 1, except for deltas spanning a whole
    epoch: each is a full epoch's travel from nearly the same center, and adding them
    all overshoots by ``num_workers - 1`` times.

    Example:
        >>> import numpy as np
        >>> new = Delta(staleness="inverse").apply(
        ...     [np.zeros(2, np.float32)],
        ...     Update(worker=0, arrays=[np.ones(2, np.float32)], samples=1, base_version=3),
        ...     version=7)
        >>> new[0].tolist()
        [0.25, 0.25]
    """

    name: ClassVar[str] = "delta"
    supports_outer_optimizer: ClassVar[bool] = True
    staleness: str = "none"
    scale: float = 1.0
    #: Where ``scale`` comes from, in words (:meth:`describe`); not compared.
    reason: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.staleness not in STALENESS:
            raise ConfigError(
                f"Expected staleness to be one of {STALENESS}. "
                f"Received: staleness={self.staleness!r}"
            )

    @classmethod
    def resolve(cls, settings: FitSettings) -> Delta:
        num_workers, whole_epoch = settings.num_workers, settings.whole_epoch
        workers = max(num_workers, 1)
        rule = settings.lr_scaling  # the rule "auto" resolved to for this model
        if settings.synchronous:
            scale, reason = 1.0, ""  # the service averages the round's deltas
        elif settings.delta_scale is not None:
            scale = float(settings.delta_scale)
            reason = f"delta_scale={scale:g}"
            if scale == 1.0 and whole_epoch and num_workers > 1:
                _log.warning(
                    "merge=%r with delta_scale=1 adds each worker's whole-epoch delta in "
                    "full, so the center moves about num_workers=%d times as far per epoch "
                    "as one worker would, and may oscillate. The default delta_scale "
                    "(None) divides deltas by num_workers.",
                    cls.name,
                    num_workers,
                )
        elif rule is not None:
            # The learning-rate recipe makes up for the division (lr_factor: 1 / scale).
            scale = 1.0 / workers
            part = " in part (by the square root)" if rule == "sqrt" else ""
            reason = f"delta_scale=None: 1/{workers}, which lr_scaling={rule!r} makes up for{part}"
        elif whole_epoch:
            scale = 1.0 / workers
            reason = (
                f"delta_scale=None: 1/{workers}, as a push spans a whole epoch; "
                "lr_scaling=None does not make up for it"
            )
        else:
            scale, reason = 1.0, "delta_scale=None with lr_scaling=None: textbook Downpour"
        return cls(staleness=settings.staleness, scale=scale, reason=reason)

    def lr_factor(self, num_workers: int, synchronous: bool) -> float:
        # A round's deltas are averaged; asynchronous ones are added scaled.
        return float(max(num_workers, 1)) if synchronous else 1.0 / self.scale

    def describe(self, synchronous: bool) -> str:
        if synchronous:
            return "the round's deltas averaged (delta_scale does not apply)"
        stale = "; a delta k versions old is divided by k" if self.staleness == "inverse" else ""
        why = f" ({self.reason})" if self.reason else ""
        if self.scale == 1.0:
            return f"each delta is added in full{why}{stale}"
        return f"each delta is multiplied by {self.scale:.3g} before it is pushed{why}{stale}"

    def outgoing(self, local: Arrays, center: Arrays) -> list[np.ndarray]:
        out = []
        for w, c in zip(local, center, strict=True):
            if not is_float(w):
                out.append(w)
                continue
            delta = w - c
            out.append(delta if self.scale == 1.0 else delta * w.dtype.type(self.scale))
        return out

    def unsent_weights(self, unsent: np.ndarray) -> np.ndarray:
        return unsent if self.scale == 1.0 else unsent / unsent.dtype.type(self.scale)

    def combine(self, center: Arrays, updates: Sequence[Update]) -> list[np.ndarray]:
        # Differences: one with no samples (all zeros uncompressed; a codec's held-back
        # part otherwise) still counts, at one worker's share.
        mean = Average(relative=True).combine([np.zeros_like(c) for c in center], updates)
        return [c + d if is_float(c) else d for c, d in zip(center, mean, strict=True)]

    def apply(self, center: Arrays, update: Update, version: int) -> list[np.ndarray]:
        scale = self._age_scale(update, version)
        out = []
        for c, d in zip(center, update.arrays, strict=True):
            if not is_float(c):
                out.append(np.array(d, dtype=c.dtype))
            elif scale == 1.0:
                out.append(np.add(c, d))  # one pass into new memory, no copy first
            else:
                out.append(np.add(c, d * c.dtype.type(scale)))
        return out

    def _step(self, center: np.ndarray, pushed: np.ndarray, update: Update, version: int) -> None:
        scale = self._age_scale(update, version)
        if scale == 1.0:
            np.add(center, pushed, out=center)
        else:
            np.add(center, pushed * center.dtype.type(scale), out=center)

    def _age_scale(self, update: Update, version: int) -> float:
        lag = max(version - update.base_version, 0)
        return 1.0 / lag if self.staleness == "inverse" and lag > 1 else 1.0


@register
@dataclass(frozen=True)
class Elastic(Merge):
    """Elastic averaging (EASGD, Zhang, Choromanska and LeCun 2015).

    Workers push their elastic difference ``d = alpha * (w - center_seen)`` and move
    their own weights by ``-d``; the center moves by ``+d``. In a synchronous round the
    differences of all workers, computed against the same center, are summed: Sync
    EASGD. Asynchronously each is added as it arrives, computed against the center the
    worker received with its previous answer (DeepSpark's asynchronous EASGD). A worker
    keeps its own weights after an answer and only remembers the center.

    A fit resolves ``alpha`` from the ``elastic_alpha`` setting, or ``0.9 / num_workers``
    when it is ``None`` (:meth:`resolve`); the field's own default, 0.9, is that rule for
    one worker (SC'17's beta), used only when the class is built by hand.

    Example:
        >>> import numpy as np
        >>> ups = [Update(worker=0, arrays=[np.array([0.5])], samples=1),
        ...        Update(worker=1, arrays=[np.array([-0.25])], samples=1)]
        >>> Elastic().combine([np.array([1.0])], ups)[0].tolist()
        [1.25]
    """

    name: ClassVar[str] = "elastic"
    error_feedback: ClassVar[bool] = False
    supports_outer_optimizer: ClassVar[bool] = False
    alpha: float = ELASTIC_BETA
    #: Where ``alpha`` comes from, in words (:meth:`describe`); not compared.
    reason: str = field(default="", compare=False, repr=False)

    @classmethod
    def resolve(cls, settings: FitSettings) -> Elastic:
        alpha = settings.elastic_alpha
        if alpha is not None:
            return cls(alpha=float(alpha), reason=f"elastic_alpha={float(alpha):g}")
        workers = max(settings.num_workers, 1)
        return cls(
            alpha=ELASTIC_BETA / workers,
            reason=f"elastic_alpha=None: {ELASTIC_BETA:g}/{workers} workers",
        )

    def lr_factor(self, num_workers: int, synchronous: bool) -> float:
        # In steady state the center and the workers advance n / (n + 1) of one
        # worker's step per round, whatever alpha (``docs/guides/modes-and-merges.md``), while
        # one process takes the n workers' steps in turn.
        return float(max(num_workers, 1) + 1)

    def describe(self, synchronous: bool) -> str:
        return f"alpha {self.alpha:.3g}" + (f" ({self.reason})" if self.reason else "")

    def outgoing(self, local: Arrays, center: Arrays) -> list[np.ndarray]:
        return [
            (w - c) * w.dtype.type(self.alpha) if is_float(w) else w
            for w, c in zip(local, center, strict=True)
        ]

    def moved(self, local: list[np.ndarray], pushed: Arrays) -> list[np.ndarray]:
        return [w - d if is_float(w) else w for w, d in zip(local, pushed, strict=True)]

    def incoming(self, local: Arrays, pushed: Arrays, answer: Arrays) -> list[np.ndarray]:
        return [w - d if is_float(w) else c for w, d, c in zip(local, pushed, answer, strict=True)]

    def settle(self, local: Arrays, at_push: Arrays, answer: Arrays) -> list[np.ndarray]:
        return list(local)

    def combine(self, center: Arrays, updates: Sequence[Update]) -> list[np.ndarray]:
        merged = []
        for i, c in enumerate(center):
            if not is_float(c):
                merged.append(np.array(updates[0].arrays[i], dtype=c.dtype))
                continue
            total = np.array(c, copy=True)
            for update in updates:
                total += update.arrays[i]
            merged.append(total)
        return merged

    def apply(self, center: Arrays, update: Update, version: int) -> list[np.ndarray]:
        return [
            np.add(c, d) if is_float(c) else np.array(d, dtype=c.dtype)
            for c, d in zip(center, update.arrays, strict=True)
        ]

    def _step(self, center: np.ndarray, pushed: np.ndarray, update: Update, version: int) -> None:
        np.add(center, pushed, out=center)
