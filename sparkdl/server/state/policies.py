"""Policies: the service half of each mode, how the store runs a push.

A :class:`~sparkdl.sync.modes.Mode` (in :mod:`sparkdl.sync`, shared with the workers)
says how pushes are scheduled: its traits and its worker half. Its service half lives
here, inside the parameter service, as the :class:`~sparkdl.server.state.store.WeightStore`'s
per-mode policy, composed of the steps of its
:class:`~sparkdl.server.state.training.TrainingState` (what a policy may use of it is
:class:`PushSteps`, so this module needs nothing of the training state's own): a
synchronous round collects one push per
worker and merges when its quorum pushed; asynchronous merges each push at once under
the lock; hogwild keeps only the bookkeeping under the lock and adds the push into the
live center with none.

A policy is found by its mode's name, walking the mode's base classes, so a new mode
that subclasses one of these schedules needs no policy of its own; a new schedule is
one :class:`PushPolicy` subclass decorated with :func:`register`. Policies hold no
state: the store holds it, and a policy holds the store's lock where it says.

Example:
    >>> from sparkdl.sync.modes import Hogwild, Synchronous
    >>> type(policy_for(Hogwild())).__name__, policy_for(Synchronous()).live_center
    ('HogwildPolicy', False)
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable
from typing import ClassVar, Protocol

import numpy as np

from sparkdl.errors import ConfigError
from sparkdl.server.state.center import Center
from sparkdl.server.state.control import ControlChannel
from sparkdl.server.state.errors import StoreError
from sparkdl.server.state.ledger import WorkerLedger, WorkerRecord
from sparkdl.server.state.rounds import Rounds
from sparkdl.sync.merges import Merge, Update
from sparkdl.sync.modes import Asynchronous, Hogwild, Mode, Synchronous
from sparkdl.sync.outer import OuterState
from sparkdl.sync.registry import Registry

__all__ = [
    "POLICIES",
    "AsynchronousPolicy",
    "HogwildPolicy",
    "PushPolicy",
    "PushSteps",
    "SynchronousPolicy",
    "policy_for",
    "register",
]


class PushSteps(Protocol):
    """What a policy uses of the store: its parts and the steps across them, each run
    with :attr:`lock` held (:class:`~sparkdl.server.state.training.TrainingState`)."""

    lock: threading.Condition
    num_workers: int
    merge: Merge
    center: Center
    rounds: Rounds
    ledger: WorkerLedger
    control: ControlChannel
    outer: OuterState | None
    #: Summed magnitudes of hogwild steps admitted but not yet added in.
    in_flight: list[float]

    def screen(self, update: Update, seq: int, attempt: int) -> bool:
        """Checks a push; returns whether ``seq`` repeats."""

    def admit(self, worker: int, seq: int | None, attempt: int) -> tuple[WorkerRecord, bool]:
        """Fences old attempts; returns the worker's record and whether ``seq`` repeats."""

    def record(
        self, record: WorkerRecord, update: Update, *, seq: int, applied: bool = True
    ) -> None:
        """Records a push in the ledger, and its epoch logs in the history."""

    def pending_round(self) -> list[float]:
        """Summed magnitudes of the open synchronous round's pushes, per array."""

    def merge_round(self) -> None:
        """Merges the open synchronous round into the next version."""

    def new_generation(self, worker: int, attempt: int) -> None:
        """Spark retried the barrier stage: fence the old attempts, drop the open round."""


class PushPolicy(abc.ABC):
    """How the store takes pushes for one mode. Instances hold no state."""

    #: The name of the mode it serves (``mode=``).
    name: ClassVar[str] = ""
    #: Whether pushes change the center's arrays in place (answers are never cached).
    live_center: ClassVar[bool] = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    @abc.abstractmethod
    def push(self, store: PushSteps, update: Update, *, seq: int, attempt: int) -> int:
        """Takes one push; returns the version whose weights answer it.

        The route answers once that version is visible (a synchronous round may still
        be open). Takes the store's lock itself.

        Raises:
            StoreError: The push is refused; nothing changed.
        """

    def epoch_quorum(self, store: PushSteps) -> int:
        """Reports that close an epoch."""
        return store.num_workers

    def rejoin(self, store: PushSteps, worker: int, attempt: int) -> None:  # noqa: B027
        """A worker joins (again); called with the lock held before it is admitted."""

    def join_complete(self, store: PushSteps) -> bool:
        """Whether a join may be answered (the lock is held)."""
        return True


#: Every policy by its mode's name; ``@POLICIES.register`` (or :func:`register`) adds one.
POLICIES: Registry[type[PushPolicy]] = Registry("mode")
register = POLICIES.register


def policy_for(mode: Mode) -> PushPolicy:
    """The policy of ``mode``: registered under its name or a base class's.

    Raises:
        ConfigError: No policy serves the mode or any of its bases.
    """
    for cls in type(mode).__mro__:
        name = getattr(cls, "name", "")
        if name and name in POLICIES:
            return POLICIES.get(name)()
    raise ConfigError(
        f"No PushPolicy serves mode={mode.name!r} or its base classes (policies serve "
        f"{tuple(POLICIES)}). Subclass one of their modes, or register a policy for it "
        "with sparkdl.server.state.policies.register."
    )


@register
class SynchronousPolicy(PushPolicy):
    """Barrier rounds: every worker pushes, the merge runs once, all continue from it.

    A push repeated with the same sequence number (a retry after a timeout) counts
    once. A newer attempt of a worker that already pushed in the open round replaces
    that push. A push for a round that already closed without it (a backup worker, or
    ``round_timeout``) is dropped: its epoch logs still count if its epoch is open, and
    it is answered at once with the current weights.
    """

    name: ClassVar[str] = Synchronous.name

    def push(self, store: PushSteps, update: Update, *, seq: int, attempt: int) -> int:
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

    def epoch_quorum(self, store: PushSteps) -> int:
        return store.rounds.quorum

    def rejoin(self, store: PushSteps, worker: int, attempt: int) -> None:
        if worker in store.rounds.joined and attempt > store.ledger.newest_attempt(worker):
            store.new_generation(worker, attempt)

    def join_complete(self, store: PushSteps) -> bool:
        return len(store.rounds.joined) >= store.num_workers


@register
class AsynchronousPolicy(PushPolicy):
    """First come, first served: each push merged into a new center under the lock.

    A push repeated with a sequence number the worker already used is not applied
    again; it is answered with the current version.
    """

    name: ClassVar[str] = Asynchronous.name

    def push(self, store: PushSteps, update: Update, *, seq: int, attempt: int) -> int:
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

    def _pending(self, store: PushSteps) -> Callable[[], list[float]] | None:
        """What :meth:`~sparkdl.server.state.center.Center.reserve` adds to a recomputed
        bound: nothing, the center holds every admitted push."""
        return None

    def _apply_locked(self, store: PushSteps, update: Update, version: int) -> None:
        after = store.merge.apply(store.center.weights, update, version)
        if store.outer is not None:  # refused before anything changes
            after = store.outer.apply_push(store.center.weights, after, store.center.check_outer)
        store.center.commit(after)

    def _apply_unlocked(self, store: PushSteps, update: Update, version: int) -> None:
        """Hogwild's step outside the lock; nothing here."""


@register
class HogwildPolicy(AsynchronousPolicy):
    """Asynchronous without a lock on the weights (Recht et al. 2011).

    Only the bookkeeping (sequence numbers, version, samples) is done under the lock;
    numpy then adds the push into the live center with no lock held, so pushes from
    several request threads add at once. What may race: two adds to the same element
    can interleave their read-modify-write and lose one of them, and a worker may pull
    weights with another push half applied. Both are the bounded noise that Hogwild
    shows SGD tolerates; every push is still applied at most once and the arrays'
    shapes never change.
    """

    name: ClassVar[str] = Hogwild.name
    live_center: ClassVar[bool] = True

    def _pending(self, store: PushSteps) -> Callable[[], list[float]] | None:
        return lambda: list(store.in_flight)  # steps admitted, still being added

    def _apply_locked(self, store: PushSteps, update: Update, version: int) -> None:
        store.center.bump()  # only the count: the step is taken outside the lock
        for i, m in enumerate(update.magnitudes):
            store.in_flight[i] += m

    def _outer_step(self, store: PushSteps, update: Update, version: int) -> None:
        """Hogwild's outer step: from one reading of the center (the adds of other
        pushes go on meanwhile), checked, then added in place. The push is already
        counted, so a step past the dtype's range aborts the fit."""
        assert store.outer is not None
        live = store.center.weights
        base = [np.array(c) for c in live]
        after = store.merge.apply(base, update, version)
        found: list[float] = []
        try:
            steps, _ = store.outer.push_steps(
                base, after, lambda trial: found.extend(store.center.outer_magnitudes(trial))
            )
        except StoreError as exc:
            with store.lock:
                store.control.abort(exc.message)
                store.lock.notify_all()
            raise
        with store.lock:
            store.center.raise_bounds(found)
        for c, new, step in zip(live, after, steps, strict=True):
            if step is None:
                c[...] = new
            else:
                np.add(c, step.astype(c.dtype, copy=False), out=c)

    def _apply_unlocked(self, store: PushSteps, update: Update, version: int) -> None:
        try:
            if store.outer is None or store.outer.optimizer.identity:
                store.merge.apply_in_place(store.center.weights, update, version)
            else:  # the outer step on this push's change alone, added in place
                self._outer_step(store, update, version)
        finally:
            with store.lock:
                for i, m in enumerate(update.magnitudes):  # (rounding never below 0)
                    store.in_flight[i] = max(store.in_flight[i] - m, 0.0)
