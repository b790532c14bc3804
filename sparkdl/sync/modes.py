"""Modes: how pushes are scheduled, one class per mode with its service and worker halves.

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

The service half runs inside :class:`sparkdl.server.store.WeightStore`, holding its
lock where it says; the worker half is arithmetic over
:class:`~sparkdl.sync.schedule.Schedule`. A new mode is one subclass decorated with
:func:`register`.

Example:
    >>> mode_class("hogwild").default_merge, Synchronous.can_overlap
    ('delta', False)
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from sparkdl.server.errors import StoreError
from sparkdl.sync.merges import Average, Delta, Update
from sparkdl.sync.registry import Registry
from sparkdl.sync.schedule import Schedule, rounds_per_epoch

if TYPE_CHECKING:
    from sparkdl.server.store import WeightStore

__all__ = [
    "MODES",
    "Asynchronous",
    "Hogwild",
    "Mode",
    "Standing",
    "Synchronous",
    "mode_class",
    "register",
]

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
    """A schedule of pushes: both halves. Instances hold no state."""

    #: The name users pass as ``mode=``.
    name: ClassVar[str] = ""
    #: The merge used when none is given.
    default_merge: ClassVar[str] = Delta.name
    #: Whether a worker may push in the background and train on (``overlap``).
    can_overlap: ClassVar[bool] = True
    #: Whether every worker takes part in every round (a barrier stage).
    barrier: ClassVar[bool] = False
    #: Whether pushes change the center's arrays in place (answers are never cached).
    live_center: ClassVar[bool] = False

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    # ----------------------------------------------------------- service half
    @abc.abstractmethod
    def push(self, store: WeightStore, update: Update, *, seq: int, attempt: int) -> int:
        """Takes one push; returns the version whose weights answer it.

        The route answers once that version is visible (a synchronous round may still
        be open). Takes the store's lock itself.

        Raises:
            StoreError: The push is refused; nothing changed.
        """

    def epoch_quorum(self, store: WeightStore) -> int:
        """Reports that close an epoch."""
        return store.num_workers

    def rejoin(self, store: WeightStore, worker: int, attempt: int) -> None:  # noqa: B027
        """A worker joins (again); called with the lock held before it is admitted."""

    def join_complete(self, store: WeightStore) -> bool:
        """Whether a join may be answered (the lock is held)."""
        return True

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

    def push(self, store: WeightStore, update: Update, *, seq: int, attempt: int) -> int:
        worker, round_no = update.worker, update.base_version
        with store.lock:
            store.control.check_aborted()
            duplicate = store.screen(update, seq, attempt)
            version = store.center.version
            if round_no > version:
                raise StoreError(
                    409,
                    f"Worker {worker} pushed for round {round_no}, but the open round is "
                    f"{version}.",
                )
            late = round_no < version or store.control.finished
            if not (duplicate or late):
                store.center.reserve(
                    update.magnitudes, store.pending_round, additive=store.merge.additive
                )
            record, _ = store.admit(worker, seq, attempt)
            if duplicate:  # a retry: of a merged round, or of one still open
                if round_no < version or store.control.finished:
                    return version
                return round_no + 1
            store.record(record, update, seq=seq, applied=not late)
            if late:  # (its epoch logs may have finished the fit and merged the round)
                return store.center.version
            store.rounds.add(update)
            if store.rounds.full():
                store.merge_round()
        return round_no + 1

    def epoch_quorum(self, store: WeightStore) -> int:
        return store.rounds.quorum

    def rejoin(self, store: WeightStore, worker: int, attempt: int) -> None:
        if worker in store.rounds.joined and attempt > store.ledger.newest_attempt(worker):
            store.new_generation(worker, attempt)

    def join_complete(self, store: WeightStore) -> bool:
        return len(store.rounds.joined) >= store.num_workers

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

    def push(self, store: WeightStore, update: Update, *, seq: int, attempt: int) -> int:
        with store.lock:
            store.control.check_aborted()
            duplicate = store.screen(update, seq, attempt)
            version = store.center.version
            if not duplicate:
                if update.base_version > version:
                    raise StoreError(
                        400,
                        f"Worker {update.worker} pushed an update against version "
                        f"{update.base_version}, but the service is at version {version}.",
                    )
                store.center.reserve(
                    update.magnitudes, self._pending(store), additive=store.merge.additive
                )
            record, _ = store.admit(update.worker, seq, attempt)
            if duplicate:
                return version
            self._apply_locked(store, update, version)
            store.record(record, update, seq=seq)
            version = store.center.version
            store.lock.notify_all()
        self._apply_unlocked(store, update, version - 1)
        return version

    def _pending(self, store: WeightStore) -> Callable[[], list[float]] | None:
        """What :meth:`~sparkdl.server.center.Center.reserve` adds to a recomputed
        bound: nothing, the center holds every admitted push."""
        return None

    def _apply_locked(self, store: WeightStore, update: Update, version: int) -> None:
        store.center.commit(store.merge.apply(store.center.weights, update, version))

    def _apply_unlocked(self, store: WeightStore, update: Update, version: int) -> None:
        """Hogwild's step outside the lock; nothing here."""

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
    """Asynchronous without a lock on the weights (Recht et al. 2011).

    Only the bookkeeping (sequence numbers, version, samples) is done under the lock;
    numpy then adds the push into the live center with no lock held, so pushes from
    several request threads add at once. What may race: two adds to the same element
    can interleave their read-modify-write and lose one of them, and a worker may pull
    weights with another push half applied. Both are the bounded noise that Hogwild
    shows SGD tolerates; every push is still applied at most once and the arrays'
    shapes never change.
    """

    name: ClassVar[str] = "hogwild"
    live_center: ClassVar[bool] = True

    def _pending(self, store: WeightStore) -> Callable[[], list[float]] | None:
        return lambda: list(store.in_flight)  # steps admitted, still being added

    def _apply_locked(self, store: WeightStore, update: Update, version: int) -> None:
        store.center.bump()  # only the count: the step is taken outside the lock
        for i, m in enumerate(update.magnitudes):
            store.in_flight[i] += m

    def _apply_unlocked(self, store: WeightStore, update: Update, version: int) -> None:
        try:
            store.merge.apply_in_place(store.center.weights, update, version)
        finally:
            with store.lock:
                for i, m in enumerate(update.magnitudes):  # (rounding never below 0)
                    store.in_flight[i] = max(store.in_flight[i] - m, 0.0)
