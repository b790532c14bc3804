"""Modes: how pushes are scheduled, one class per mode: its traits and its worker half.

==============  =======================================  ================================
mode            service half                             worker half
==============  =======================================  ================================
synchronous     a round collects one push per worker     rounds per epoch from the
                and merges when its quorum pushed; a     longest partition (padding
                retried barrier stage starts a new       rounds for shorter ones);
                generation                               resume at the last round
asynchronous    each push merged at once under the lock  syncs from its own partition;
                (first come, first served)               resume after its last push
hogwild         bookkeeping under the lock, the merge    as asynchronous
                added into the live center with none
==============  =======================================  ================================

The worker half is arithmetic over :class:`~sparkdl.sync.schedule.Schedule`. The
service half is the parameter service's own: the store's per-mode policy
(:mod:`sparkdl.server.state.policies`), found by the mode's name. A new mode is one subclass
decorated with :func:`register` (and, for a schedule of pushes none of these has, a
policy registered under its name).

Example:
    >>> mode_class("hogwild").default_merge, Synchronous.can_overlap
    ('delta', False)
"""

from __future__ import annotations

import abc
from typing import ClassVar, NamedTuple

from sparkdl.sync.merges import Average, Delta
from sparkdl.sync.registry import Registry
from sparkdl.sync.schedule import Schedule, rounds_per_epoch
from sparkdl.sync.settings import FitSettings

__all__ = [
    "DEFAULT_ROUND_TIMEOUT",
    "MODES",
    "Asynchronous",
    "Hogwild",
    "Mode",
    "Standing",
    "Synchronous",
    "mode_class",
    "register",
]

#: Seconds an open synchronous round waits for missing workers unless told otherwise
#: (``round_timeout``).
DEFAULT_ROUND_TIMEOUT = 3600.0

#: ``(epoch, batches done in it, syncs done in it)``: where a (re)joining worker starts.
Resume = tuple[int, int, int]


class Standing(NamedTuple):
    """Where training stands when a worker (re)joins.

    Attributes:
        initial_epoch: Epochs done before this fit.
        version: The service's version.
        position: ``(epoch, batches done)`` after the worker's last applied push.
    """

    initial_epoch: int
    version: int
    position: tuple[int, int] | list[int] | None


class Mode(abc.ABC):
    """A schedule of pushes: its traits and worker half. Instances hold no state."""

    #: The name users pass as ``mode=``.
    name: ClassVar[str] = ""
    #: The merge used when none is given.
    default_merge: ClassVar[str] = Delta.name
    #: Whether a worker may push in the background and train on (``overlap``).
    can_overlap: ClassVar[bool] = True
    #: Whether every worker takes part in every round (a barrier stage).
    barrier: ClassVar[bool] = False

    @classmethod
    def resolve(cls, settings: FitSettings) -> Mode:
        """The mode for one fit, built on the driver as every extension point is
        (:mod:`sparkdl.sync.settings`); the built-in modes hold no settings.

        Example:
            >>> Hogwild.resolve(FitSettings())
            Hogwild()
        """
        return cls()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    # ------------------------------------------------------------ worker half
    @abc.abstractmethod
    def rounds_per_epoch(self, own_steps: int, all_steps: list[int], frequency: int | None) -> int:
        """Syncs per epoch of a worker taking ``own_steps`` batches an epoch.

        Args:
            own_steps: This worker's batches per epoch.
            all_steps: Every worker's, in worker order (as the service's join tells).
            frequency: Batches between syncs, or ``None``.
        """

    @abc.abstractmethod
    def resume(self, schedule: Schedule, standing: Standing) -> Resume:
        """Where a (re)joining worker starts: ``(epoch, batches done, syncs done)``.

        Args:
            schedule: The worker's sync points.
            standing: Where training stands, as the service's join told.
        """


#: Every mode by name; ``@MODES.register`` (or :func:`register`) adds one.
MODES: Registry[type[Mode]] = Registry("mode")
register = MODES.register
mode_class = MODES.get


@register
class Synchronous(Mode):
    """Barrier rounds: every worker pushes, the merge runs once, all continue from it.

    A push repeated with the same sequence number (a retry after a timeout) counts
    once. A newer attempt of a worker that already pushed in the open round replaces
    that push. A push for a round that already closed without it (a backup worker, or
    ``round_timeout``) is dropped: its epoch logs still count if its epoch is open, and
    it is answered at once with the current weights.

    Example:
        >>> Synchronous().rounds_per_epoch(5, [6, 5], frequency=4)
        2
    """

    name: ClassVar[str] = "synchronous"
    default_merge: ClassVar[str] = Average.name
    can_overlap: ClassVar[bool] = False
    barrier: ClassVar[bool] = True

    def rounds_per_epoch(self, own_steps: int, all_steps: list[int], frequency: int | None) -> int:
        return rounds_per_epoch(all_steps, frequency)  # every worker takes part in every round

    def resume(self, schedule: Schedule, standing: Standing) -> Resume:
        """At the last completed round ``version`` (rounds count from ``initial_epoch``).

        Example:
            >>> Synchronous().resume(Schedule(rows=23, batch_size=1, frequency=4, rounds=6),
            ...                      Standing(initial_epoch=0, version=15, position=None))
            (2, 12, 3)
        """
        rounds, version = schedule.rounds, standing.version
        epoch, done = standing.initial_epoch + version // rounds, version % rounds
        every = schedule.frequency
        return epoch, min(done * every, schedule.steps) if every else 0, done


@register
class Asynchronous(Mode):
    """First come, first served: each push merged into a new center under the lock.

    A push repeated with a sequence number the worker already used is not applied
    again; it is answered with the current version.

    Example:
        >>> Asynchronous().rounds_per_epoch(5, [9, 5], frequency=4)
        2
    """

    name: ClassVar[str] = "asynchronous"

    def rounds_per_epoch(self, own_steps: int, all_steps: list[int], frequency: int | None) -> int:
        return rounds_per_epoch([own_steps], frequency)

    def resume(self, schedule: Schedule, standing: Standing) -> Resume:
        """After the worker's last applied push, ``position``, or at ``initial_epoch``.

        Example:
            >>> Asynchronous().resume(Schedule(rows=23, batch_size=1, frequency=None, rounds=1),
            ...                       Standing(initial_epoch=0, version=40, position=(4, 23)))
            (5, 0, 0)
        """
        position = standing.position
        if position is None:
            return standing.initial_epoch, 0, 0
        epoch, step = int(position[0]), int(position[1])
        if step >= schedule.steps:
            return epoch + 1, 0, 0
        every = schedule.frequency
        return epoch, step, step // every if every else 0


@register
class Hogwild(Asynchronous):
    """Asynchronous without a lock on the weights (Recht et al. 2011): the service adds
    each push into the live center with no lock held; what may race, and why that is
    safe, is :class:`~sparkdl.server.state.policies.HogwildPolicy`'s to say. Workers schedule
    their pushes as in asynchronous mode.
    """

    name: ClassVar[str] = "hogwild"
