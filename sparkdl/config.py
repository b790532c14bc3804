"""Validated settings of one fit: each declared once, grouped by concern, one flat API.

Every setting is one field of one group, a frozen keyword-only dataclass per concern
(as Ray Train splits scaling, run and failure configs): :class:`SyncConfig` (mode,
merge and their knobs), :class:`ScalingConfig`, :class:`RunConfig`,
:class:`FailureConfig`, :class:`ServiceConfig` and :class:`CheckpointConfig`. The
field holds the setting's name, type, default, description and check
(:func:`setting`); everything else reads it there: :class:`TrainConfig`, the flat
keyword API users pass (it inherits every group's fields), its docstring, the
estimator's Spark ML Params (:mod:`sparkdl.ml.params`), the docs' settings reference,
``python -m sparkdl --help``, and the plan's settings taken as given
(:class:`sparkdl.contract.plan.FitPlan`). Building a config validates each group at
once, so a wrong setting fails on the driver before any Spark job starts. What a fit
then runs with, settings plus the cluster's facts, is resolved once into a
:class:`~sparkdl.contract.plan.FitPlan`.

Example:
    >>> config = TrainConfig(epochs=5, num_workers=2, frequency=4)
    >>> config.frequency, config.sync.resolved_frequency, config.scaling.num_workers
    (4, 4, 2)
    >>> setting_docs()["epochs"]
    'Passes over the data.'
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkdl.errors import ConfigError
from sparkdl.protocol.client import DEFAULT_RETRIES, DEFAULT_TIMEOUT
from sparkdl.sync.codecs import CODECS, resolve_codec
from sparkdl.sync.merges import MERGES, STALENESS, merge_class
from sparkdl.sync.modes import DEFAULT_ROUND_TIMEOUT, MODES, Synchronous, mode_class
from sparkdl.sync.outer import MODEL as OUTER_MODEL
from sparkdl.sync.outer import check as check_outer
from sparkdl.sync.recipe import check as check_recipe
from sparkdl.sync.registry import Registry

__all__ = [
    "DATA_CACHES",
    "FREQUENCIES",
    "GROUPS",
    "SERVICE_PLACEMENTS",
    "CheckpointConfig",
    "FailureConfig",
    "RunConfig",
    "ScalingConfig",
    "ServiceConfig",
    "SyncConfig",
    "TrainConfig",
    "setting",
    "setting_docs",
    "setting_fields",
]

#: Named sync frequencies; an int N means "every N batches".
FREQUENCIES: tuple[str, ...] = ("epoch", "batch")
#: Where a worker keeps its partition (``TrainConfig.data_cache``).
DATA_CACHES: tuple[str, ...] = ("auto", "memory", "disk")
#: The most shards a parameter service splits into (``TrainConfig.service_shards``).
MAX_SHARDS = 64
#: Where the parameter service runs (``TrainConfig.service_placement``).
SERVICE_PLACEMENTS: tuple[str, ...] = ("auto", "driver", "cluster")

#: A setting's own check: ``check(name, value)`` raises :class:`~sparkdl.ConfigError`.
Check = Callable[[str, Any], None]


def setting(default: Any, doc: str, *, check: Check | None = None) -> Any:
    """Declares one setting: a group's field with its default, description and check.

    Args:
        default: The value when the setting is not given.
        doc: What it does, in reST (one paragraph; line breaks are spaces).
        check: Raises :class:`~sparkdl.ConfigError` naming the setting for a value it
            refuses; checks across settings live in the group's ``__post_init__``.

    Example:
        >>> f = dataclasses.fields(RunConfig)[0]
        >>> f.name, f.default, f.metadata["doc"]
        ('epochs', 1, 'Passes over the data.')
    """
    return field(default=default, metadata={"doc": " ".join(doc.split()), "check": check})


def _check_each(group: Any) -> None:
    """Runs each setting's own check on its value, in the order they are declared."""
    for f in dataclasses.fields(group):
        check = f.metadata.get("check")
        if check is not None:
            check(f.name, getattr(group, f.name))


def _registered(registry: Registry[Any], *, optional: bool = False) -> Check:
    """A name registered in ``registry`` (its error names the setting and the names)."""

    def check(name: str, value: Any) -> None:
        if not (optional and value is None):
            registry.get(value)

    return check


def _one_of(choices: Any) -> Check:
    def check(name: str, value: Any) -> None:
        if value not in choices:
            raise ConfigError(f"Expected {name} to be one of {choices}. Received: {name}={value!r}")

    return check


def _int_within(low: int, high: int) -> Check:
    def check(name: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigError(
                f"Expected {name} to be an int in [{low}, {high}]. Received: {name}={value!r}"
            )

    return check


def _true_false_or_none(hint: str = "") -> Check:
    def check(name: str, value: Any) -> None:
        if value is not None and not isinstance(value, bool):
            raise ConfigError(
                f"Expected {name} to be True, False or None{hint}. Received: {name}={value!r}"
            )

    return check


def _optional(inner: Check) -> Check:
    def check(name: str, value: Any) -> None:
        if value is not None:
            inner(name, value)

    return check


def _positive_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"Expected {name} to be a number > 0. Received: {name}={value!r}")


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"Expected {name} to be an int >= 1. Received: {name}={value!r}")


def _count(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"Expected {name} to be an int >= 0. Received: {name}={value!r}")


def _retries(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"Expected {name} to be an int >= 0. Received: {value!r}")


def _fraction(name: str, value: Any) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1
    ):
        raise ConfigError(
            f"Expected {name} to be a number in (0, 1] or None. Received: {name}={value!r}"
        )


def _frequency(name: str, value: Any) -> None:
    if isinstance(value, bool) or not (
        (isinstance(value, int) and value >= 1) or value in FREQUENCIES
    ):
        raise ConfigError(
            f"Expected {name} to be one of {FREQUENCIES} or an int >= 1 (sync every N "
            f"batches). Received: {name}={value!r}"
        )


def _seed(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"Expected {name} to be an int or None. Received: {name}={value!r}")


def _verbose(name: str, value: Any) -> None:
    if value not in (0, 1, 2):
        raise ConfigError(f"Expected {name} to be 0, 1 or 2. Received: {name}={value!r}")


def _validation_split(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(f"Expected {name} to be a number in [0, 1). Received: {name}={value!r}")


def _class_weight(name: str, value: Any) -> None:
    _class_weights(value)


@dataclass(frozen=True, kw_only=True)
class SyncConfig:
    """How workers sync: the mode, the merge, compression, the learning-rate recipe."""

    mode: str = setting(
        Synchronous.name,
        """How updates are scheduled. ``"synchronous"``: barrier rounds; every worker
        pushes, the service merges, every worker continues from the result.
        ``"asynchronous"``: first come first served, each update applied under a lock.
        ``"hogwild"``: first come first served, applied without a lock.""",
        check=_registered(MODES),
    )
    merge: str | None = setting(
        None,
        """How the service combines updates. ``"average"``: weights averaged (synchronous:
        weighted by samples; asynchronous: each push moves the center 1/num_workers of
        the way to the pushed weights). ``"delta"``: workers push ``w_new - w_pulled``
        and the service adds it. ``"elastic"``: EASGD; worker and center move toward
        each other by ``elastic_alpha * (w - center)``. ``None``: ``"average"`` for
        synchronous mode, ``"delta"`` otherwise.""",
        check=_registered(MERGES),
    )
    staleness: str = setting(
        "none",
        """``"none"`` or ``"inverse"``: an asynchronous delta computed against a center k
        versions old is scaled by 1/k.""",
        check=_one_of(STALENESS),
    )
    elastic_alpha: float | None = setting(
        None,
        """The EASGD moving rate, in (0, 1]; ``None`` uses ``0.9 / num_workers`` (the fit's
        resolved value is in ``fit_report``).""",
        check=_fraction,
    )
    delta_scale: float | None = setting(
        None,
        """Asynchronous ``merge="delta"``: each worker multiplies its delta by this before
        pushing it. ``None``: 1/num_workers, which ``lr_scaling`` makes up for with a
        higher rate on the workers; with ``lr_scaling=None``, 1/num_workers only when a
        push spans a whole epoch (``frequency="epoch"``, or N at least an epoch's
        batches), where every worker's delta is a full epoch's travel from nearly the
        same center and adding them all overshoots by num_workers - 1 times, else 1
        (textbook Downpour). Synchronous mode averages the round's deltas and ignores
        it.""",
        check=_fraction,
    )
    frequency: str | int = setting(
        "epoch",
        """When workers sync: ``"epoch"``, ``"batch"`` or an int N (every N batches). Every
        epoch also ends with a sync.""",
        check=_frequency,
    )
    overlap: bool | None = setting(
        None,
        """Asynchronous and hogwild modes: a worker pushes in a background thread and keeps
        training; the answer is folded in at its next sync (the center plus the progress
        made meanwhile), so the round trip hides behind compute at the cost of one more
        update of staleness. An epoch's last push always waits for its answer, so every
        epoch starts from the center (and ``frequency="epoch"`` never overlaps).
        ``None``: on for asynchronous and hogwild modes. Synchronous rounds always wait
        for their result.""",
        check=_true_false_or_none(),
    )
    backup_workers: int = setting(
        0,
        """Synchronous mode: a round closes once all but this many workers pushed (Chen et
        al. 2016, backup workers); a push that arrives after its round closed is dropped
        and the worker continues from the current weights. The fit ends when the others
        finish every epoch.""",
        check=_count,
    )
    compression: str | None = setting(
        None,
        """Updates travel compressed both ways: ``"fp16"``, ``"bf16"``, ``"topk"`` (the
        ``compression_ratio`` largest values of each array), ``"sign"`` (1 bit per value
        and two scales per array) or ``"int4"`` (4 bits per value and a scale per block
        of 64 values). What an encoding leaves out is added to the worker's next update
        (error feedback), and answers carry the center's change since the copy each
        worker holds (:mod:`sparkdl.sync.codecs`). ``None``: full float updates.""",
        check=_registered(CODECS, optional=True),
    )
    compression_ratio: float = setting(
        0.01,
        """The fraction of each array's values a ``"topk"`` update keeps, in (0, 0.25].""",
    )
    lr_scaling: str | None = setting(
        "auto",
        """Scale the model's learning rate so the fit moves as far per epoch as one process
        would (:mod:`sparkdl.sync.recipe`): by the merge's factor (``"linear"``, Goyal
        et al. 2017) or its square root (``"sqrt"``). The factor is ``num_workers`` for
        averaging and synchronous deltas, ``1 / delta_scale`` for asynchronous deltas
        (``num_workers`` by default) and ``num_workers + 1`` for elastic averaging.
        ``"auto"`` (the default): ``"linear"`` for ``keras.optimizers.SGD`` and, in
        synchronous mode, for adaptive optimizers (Adam, RMSprop, LARS...) too;
        ``"sqrt"`` for adaptive optimizers in asynchronous and hogwild modes; none for a
        ``LearningRateSchedule``. ``None``: the model's rate as it is.""",
    )
    warmup_epochs: float = setting(
        0.0,
        """With ``lr_scaling``, ramp the rate linearly from the model's to the scaled one
        over this many epochs (gradual warm-up).""",
    )
    outer_optimizer: str | None = setting(
        None,
        """The service's own optimizer over what each merge moves
        (:mod:`sparkdl.sync.outer`): ``"nesterov"`` (DiLoCo), ``"sgd"`` (SlowMo's
        heavy-ball momentum), ``"model"`` or ``None`` (the merge as it is). With
        ``merge="average"`` or ``"delta"``; synchronous rounds step on the round's change,
        asynchronous pushes as Delayed Nesterov (the momentum updated once every
        ``num_workers`` pushes). Pair ``"nesterov"`` and ``"sgd"`` with infrequent syncs
        (``frequency`` of tens to hundreds of batches). ``"model"``: the model's own
        compiled optimizer steps the center once per round on the round's mean gradient,
        while workers take plain gradient steps: the one-process fit at a batch of
        ``batch_size x num_workers`` (synchronous mode, ``frequency="batch"``, one
        service; no ``warmup_epochs``).""",
    )
    outer_learning_rate: float | None = setting(
        None,
        """The outer optimizer's learning rate, > 0; ``None``: 0.7 (DiLoCo's).
        ``outer_optimizer="sgd"`` with 1 and ``outer_momentum=0`` is the merge itself.""",
    )
    outer_momentum: float | None = setting(
        None,
        """The outer optimizer's momentum, in [0, 1); ``None``: 0.9 (DiLoCo's).""",
    )
    sync_fragments: int = setting(
        1,
        """Split the weights into this many fragments of about equal bytes and sync one at
        a time, in turn (Streaming DiLoCo): each sync within an epoch pushes and pulls
        one fragment, so it carries 1/``sync_fragments`` of the bytes, and each fragment
        syncs every ``sync_fragments`` syncs; an epoch's closing sync carries every
        fragment, so it needs ``frequency`` in batches, several syncs an epoch. The
        fragments are the service's shards (``service_shards`` 1 or the same number).""",
        check=_int_within(1, MAX_SHARDS),
    )

    def __post_init__(self) -> None:
        if self.merge is None:  # the mode's default (an unknown mode raises here)
            object.__setattr__(self, "merge", mode_class(self.mode).default_merge)
        _check_each(self)
        resolve_codec(self.compression, self.compression_ratio)  # and its ratio
        check_recipe(self.lr_scaling, self.warmup_epochs)
        self._check_outer()
        self._check_schedule()

    def _check_outer(self) -> None:
        check_outer(self.outer_optimizer, self.outer_learning_rate, self.outer_momentum)
        if self.outer_optimizer is None:
            given = [
                name
                for name in ("outer_learning_rate", "outer_momentum")
                if getattr(self, name) is not None
            ]
            if given:
                raise ConfigError(
                    f"{given[0]} is set but outer_optimizer is None, so nothing uses it. "
                    "Set outer_optimizer='nesterov' (DiLoCo) or 'sgd' (SlowMo)."
                )
        elif self.outer_optimizer == OUTER_MODEL:
            self._check_model_outer()
        if (
            self.outer_optimizer is not None
            and not merge_class(str(self.merge)).supports_outer_optimizer
        ):
            supported = tuple(n for n, c in MERGES.items() if c.supports_outer_optimizer)
            raise ConfigError(
                f"outer_optimizer={self.outer_optimizer!r} steps on the change a merge of "
                f"the workers' progress makes, one of {supported}; merge={self.merge!r} "
                "has an outer step of its own (elastic_alpha). Use merge='average' or "
                "'delta', or drop outer_optimizer."
            )

    def _check_model_outer(self) -> None:
        """``outer_optimizer="model"``: synchronous rounds of one batch, the model's rate."""
        given = [n for n in ("outer_learning_rate", "outer_momentum") if getattr(self, n)]
        if given:
            raise ConfigError(
                f"{given[0]} is set, but outer_optimizer='model' steps with the model's "
                "own compiled optimizer, at its learning rate (scaled by lr_scaling). "
                f"Drop {given[0]}, or compile the model with the optimizer you want."
            )
        if not mode_class(self.mode).barrier:
            raise ConfigError(
                f"outer_optimizer='model' steps once per synchronous round on the round's "
                f"mean gradient; mode={self.mode!r} has no rounds. Set "
                "mode='synchronous', or drop outer_optimizer."
            )
        if self.frequency not in ("batch", 1):
            raise ConfigError(
                f"outer_optimizer='model' needs a round every batch (each worker's change "
                f"is then one gradient); frequency={self.frequency!r} would sum many "
                "steps. Set frequency='batch', or use outer_optimizer='nesterov' for "
                "infrequent syncs."
            )
        if self.sync_fragments > 1:
            raise ConfigError(
                f"outer_optimizer='model' steps the whole model every round; "
                f"sync_fragments={self.sync_fragments} syncs one part at a time. Drop "
                "sync_fragments."
            )

    def _check_schedule(self) -> None:
        """The settings that need a mode, or a frequency, that can take them."""
        mode = mode_class(self.mode)
        if self.sync_fragments > 1 and self.frequency == "epoch":
            raise ConfigError(
                f"sync_fragments={self.sync_fragments} syncs one fragment at each sync "
                "within an epoch, but frequency='epoch' makes every sync an epoch's "
                "closing one, which carries every fragment. Set frequency to a number of "
                "batches (e.g. frequency=64), or drop sync_fragments."
            )
        if self.overlap and not mode.can_overlap:
            overlapping = tuple(n for n, c in MODES.items() if c.can_overlap)
            raise ConfigError(
                f"overlap=True needs a mode whose workers push in the background, one of "
                f"{overlapping}: in mode={self.mode!r} every worker continues from the "
                "merged result of its round. Drop overlap or pick another mode."
            )
        backup = self.backup_workers
        if backup and not mode.barrier:
            barrier = tuple(n for n, c in MODES.items() if c.barrier)
            raise ConfigError(
                f"backup_workers={backup} needs a mode with rounds, one of {barrier}: "
                f"mode={self.mode!r} never waits for a slow worker. Drop backup_workers or "
                "change mode."
            )

    @property
    def resolved_frequency(self) -> int | None:
        """Batches between syncs, or ``None`` when syncing only at epoch ends.

        Example:
            >>> SyncConfig(frequency="batch").resolved_frequency
            1
        """
        if self.frequency == "epoch":
            return None
        if self.frequency == "batch":
            return 1
        assert isinstance(self.frequency, int)
        return self.frequency

    @property
    def resolved_overlap(self) -> bool:
        """``overlap``, with ``None`` resolved to what the mode allows.

        Example:
            >>> SyncConfig(mode="hogwild").resolved_overlap, SyncConfig().resolved_overlap
            (True, False)
        """
        if self.overlap is None:
            return mode_class(self.mode).can_overlap
        return self.overlap


@dataclass(frozen=True, kw_only=True)
class ScalingConfig:
    """How many workers, what each computes with and where each keeps its data."""

    num_workers: int | None = setting(
        None,
        """Number of Spark tasks that train; ``None`` uses every task slot.""",
        check=_optional(_positive_int),
    )
    threads_per_worker: int | None = setting(
        None,
        """TensorFlow intra-op threads per worker; ``None`` uses ``spark.task.cpus``.
        TensorFlow only: XLA on JAX sizes its own thread pool.""",
        check=_optional(_positive_int),
    )
    mixed_precision: bool = setting(
        False,
        """Workers compute in float16 with float32 variables (Keras's ``mixed_float16``;
        the loss is scaled). A Sequential or functional model keeps its output layers in
        float32; a subclassed model is built with ``mixed_float16`` as the default
        policy, so give its output layer ``dtype="float32"``. Worth it on GPUs with
        tensor cores; the fitted model computes in float32.""",
    )
    slot_wait_timeout: float = setting(
        60.0,
        """Seconds to wait for executors to register before failing for lack of task slots
        (non-local masters only).""",
        check=_positive_number,
    )
    data_cache: str = setting(
        "auto",
        """Where each worker keeps its partition while it trains. ``"memory"``: in memory
        (its float32 bytes, no more), batches gathered in a full random order each
        epoch. ``"disk"``: in an unnamed file under Spark's local directories, read back
        in blocks with a block-wise shuffle, so a worker's memory does not grow with its
        data. ``"auto"``: memory until the partition outgrows its budget (half of
        ``spark.executor.pyspark.memory`` per task slot when that is set, else 1 GiB),
        then disk.""",
        check=_one_of(list(DATA_CACHES)),
    )

    def __post_init__(self) -> None:
        _check_each(self)


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """What one fit trains: epochs, batches, seeds, validation, reporting."""

    epochs: int = setting(
        1,
        """Passes over the data.""",
        check=_positive_int,
    )
    batch_size: int = setting(
        32,
        """Samples per gradient step on each worker.""",
        check=_positive_int,
    )
    seed: int | None = setting(
        None,
        """Seed for weight shuffling and each worker's sample order.""",
        check=_seed,
    )
    verbose: int = setting(
        0,
        """0 prints nothing (the resolved settings go to the ``sparkdl.driver.fit`` logger
        at INFO, as always); 1 prints them, then a progress bar on the driver (lines, as
        2 does, without tqdm); 2 prints the resolved settings, then one line per
        finished epoch with its merged logs.""",
        check=_verbose,
    )
    shuffle: bool = setting(
        True,
        """Shuffle each worker's samples every epoch.""",
    )
    validate: bool = setting(
        True,
        """Before training, look at every feature and label value for NaNs (one pass over
        the data, in the aggregate job that also counts rows, nulls and ragged rows,
        which always runs). ``False`` skips that pass over every value; a NaN then shows
        up as a diverged loss.""",
    )
    validation_split: float = setting(
        0.0,
        """Fraction in [0, 1) of each worker's rows (its last ones, as in ``model.fit``)
        held out to report ``val_*`` logs every epoch.""",
        check=_validation_split,
    )
    mlflow_run: bool | str | None = setting(
        None,
        """``True`` or a run name: log params, per-epoch metrics and the model to MLflow
        (see :mod:`sparkdl.driver.tracking`); ``None``: only when MLflow's Keras
        autologging is on; ``False``: never.""",
    )
    class_weight: dict[Any, float] | None = setting(  # noqa: RUF009 (a field(), default None)
        None,
        """``{class index: weight}``, as ``model.fit(class_weight=...)``: each training
        row's loss is weighted by its label's class (a one-hot label's arg-max; a class
        left out weighs 1); validation is not. Single-output models; not together with
        ``weight_col`` (Keras refuses both too).""",
        check=_class_weight,
    )

    def __post_init__(self) -> None:
        _check_each(self)


@dataclass(frozen=True, kw_only=True)
class FailureConfig:
    """How long to wait and how often to retry."""

    request_timeout: float = setting(
        DEFAULT_TIMEOUT,
        """Seconds a worker waits for one service call (connect and read).""",
        check=_positive_number,
    )
    round_timeout: float = setting(
        DEFAULT_ROUND_TIMEOUT,
        """Seconds a synchronous round waits for missing workers; then it closes with the
        workers present and logs a warning (their late pushes are dropped, as with
        ``backup_workers``).""",
        check=_positive_number,
    )
    request_retries: int = setting(
        DEFAULT_RETRIES,
        """Retries of a failed service call (connection errors, 5xx).""",
        check=_retries,
    )

    def __post_init__(self) -> None:
        _check_each(self)


@dataclass(frozen=True, kw_only=True)
class ServiceConfig:
    """Where the parameter service runs and listens."""

    service_host: str | None = setting(
        None,
        """Address the parameter service binds to and workers call. ``None``: 127.0.0.1 for
        local masters, else ``spark.driver.host``.""",
    )
    port: int = setting(
        0,
        """Port of the parameter service; 0 picks a free one.""",
        check=_int_within(0, 65535),
    )
    service_tls: bool | None = setting(
        None,
        """Serve the parameter service over HTTPS with a certificate made for the fit and
        pinned by its workers (:mod:`sparkdl.server.web.tls`). ``None``: on unless the
        master is local (``local[...]``, ``local-cluster[...]``), where the traffic
        never leaves the machine.""",
        check=_true_false_or_none(" (on for a cluster, off for a local master)"),
    )
    service_placement: str = setting(
        "auto",
        """Where the parameter service runs: ``"driver"`` (in this process; executors
        connect to it), ``"cluster"`` (inside the training job, beside worker 0, or
        workers 0..k-1 with ``service_shards=k``; this process follows the fit through
        Spark jobs only, so it never listens on a socket), or ``"auto"``: the driver on
        a classic session, the cluster on Spark Connect.""",
        check=_one_of(list(SERVICE_PLACEMENTS)),
    )
    service_shards: int = setting(
        1,
        """Split the weights over this many parameter services of about equal bytes (whole
        variables where they fit, large ones by rows); each worker pushes to and pulls
        from all of them at once, so no one service moves every byte
        (:mod:`sparkdl.sync.shards`). Synchronous fits give one service's weights
        (without top-k or sign compression, backup workers or timed-out rounds);
        asynchronous shards merge independently. With ``service_placement="driver"`` the
        shards are services in the driver process; with ``"cluster"``, shard j runs
        beside worker j (at most ``num_workers`` shards). With a set ``port``, shard j
        listens on ``port + j``.""",
        check=_int_within(1, MAX_SHARDS),
    )

    def __post_init__(self) -> None:
        _check_each(self)
        shards = self.service_shards
        if self.port and self.port + shards - 1 > 65535:
            raise ConfigError(
                f"service_shards={shards} listen on port={self.port} to "
                f"{self.port + shards - 1}, beyond 65535. Set a lower port, or port=0."
            )
        if self.service_placement == "cluster" and self.service_host:
            raise ConfigError(
                f"service_host={self.service_host!r} names the driver's address, but "
                "service_placement='cluster' runs the service on an executor. Drop one."
            )


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Where checkpoints go and whether the fit resumes from them."""

    checkpoint_dir: str | None = setting(
        None,
        """A local directory on the driver; after every epoch the center weights, the
        epoch, the history and these settings are written there atomically (see
        :mod:`sparkdl.server.state.checkpoints`).""",
    )
    checkpoint_keep: int = setting(
        3,
        """How many of the newest checkpoints to keep.""",
        check=_positive_int,
    )
    resume: bool = setting(
        False,
        """Continue from the newest checkpoint in ``checkpoint_dir`` (its weights and epoch
        count; the history continues) instead of from the model's weights.""",
    )

    def __post_init__(self) -> None:
        _check_each(self)
        if self.resume and not self.checkpoint_dir:
            raise ConfigError("resume=True needs checkpoint_dir= (where the checkpoints are).")


#: The groups, by the attribute of :class:`TrainConfig` that holds each, in the order
#: their settings are listed (the settings reference, ``--help``, :func:`setting_fields`).
GROUPS: dict[str, type] = {
    "sync": SyncConfig,
    "scaling": ScalingConfig,
    "run": RunConfig,
    "failure": FailureConfig,
    "service": ServiceConfig,
    "checkpointing": CheckpointConfig,
}


# A dataclass lists its bases' fields from the last base on: the groups are named here
# in the reverse of GROUPS so that the settings read in GROUPS' order.
@dataclass(frozen=True, kw_only=True)
class TrainConfig(
    CheckpointConfig, ServiceConfig, FailureConfig, RunConfig, ScalingConfig, SyncConfig
):
    """Everything a fit needs besides the model and the data.

    Every group's settings, as one flat set of keywords; each is declared once, in its
    group (:func:`setting`), and the Args below are written from those declarations.
    Building it builds and validates each group (``sync``, ``scaling``, ``run``,
    ``failure``, ``service``, ``checkpointing``), then the rules across groups.

    Raises:
        ConfigError: A value is out of range or unknown.

    Example:
        >>> TrainConfig(mode="synchronous", frequency="epoch", epochs=3).epochs
        3
    """

    # The same settings by concern, each group validated when the config is built.
    sync: SyncConfig = field(init=False, repr=False, compare=False)
    scaling: ScalingConfig = field(init=False, repr=False, compare=False)
    run: RunConfig = field(init=False, repr=False, compare=False)
    failure: FailureConfig = field(init=False, repr=False, compare=False)
    service: ServiceConfig = field(init=False, repr=False, compare=False)
    checkpointing: CheckpointConfig = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for attr, group in GROUPS.items():
            fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(group)}
            object.__setattr__(self, attr, group(**fields))
        object.__setattr__(self, "merge", self.sync.merge)  # the mode's default, resolved
        fragments, shards = self.sync_fragments, self.service_shards
        if fragments > 1 and shards not in (1, fragments):
            raise ConfigError(
                f"sync_fragments={fragments} makes the fragments the service's shards, so "
                f"service_shards={shards} must be 1 or {fragments}. Set service_shards="
                f"{fragments}, or drop one of them."
            )
        if self.outer_optimizer == OUTER_MODEL and (self.warmup_epochs or shards > 1):
            name, value = (
                ("warmup_epochs", self.warmup_epochs)
                if self.warmup_epochs
                else ("service_shards", shards)
            )
            raise ConfigError(
                f"outer_optimizer='model' runs one Keras optimizer over the whole model "
                f"at its scaled rate from the first round; {name}={value} is not "
                f"supported with it. Drop {name}."
            )
        backup, workers = self.backup_workers, self.num_workers
        if backup and workers is not None and backup >= workers:
            raise ConfigError(
                f"backup_workers={backup} must be smaller than num_workers={workers}: a "
                "round needs at least one worker."
            )

    def replace(self, **changes: Any) -> TrainConfig:
        """Returns a copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Returns the settings as a plain dict (JSON-serialisable)."""
        return {f.name: getattr(self, f.name) for f in setting_fields()}


def setting_fields() -> list[dataclasses.Field[Any]]:
    """The fields of :class:`TrainConfig` a user sets (its keyword arguments), group by
    group in :data:`GROUPS`' order.

    Example:
        >>> [f.name for f in setting_fields()][:3]
        ['mode', 'merge', 'staleness']
    """
    return [f for f in dataclasses.fields(TrainConfig) if f.init]


def setting_docs() -> dict[str, str]:
    """Each setting's description, as its declaration (:func:`setting`) holds it.

    The settings reference of the docs, the Params' docs (``explainParams()``),
    :class:`TrainConfig`'s docstring and ``python -m sparkdl --help`` read it here.

    Returns:
        Setting name -> its description as one paragraph (reST inline markup kept).

    Example:
        >>> setting_docs()["batch_size"]
        'Samples per gradient step on each worker.'
    """
    return {f.name: f.metadata["doc"] for f in setting_fields()}


def _document(cls: type) -> None:
    """Writes the Args section of ``cls``'s docstring from the settings' declarations."""
    lines = ["    Args:"]
    for name, doc in setting_docs().items():
        lines += textwrap.wrap(
            f"{name}: {doc}",
            width=88,
            initial_indent=" " * 8,
            subsequent_indent=" " * 12,
            break_long_words=False,
            break_on_hyphens=False,
        )
    head, tail = (cls.__doc__ or "").split("    Raises:", 1)
    cls.__doc__ = head + "\n".join(lines) + "\n\n    Raises:" + tail


_document(TrainConfig)


def class_weights(value: dict[Any, float] | None) -> dict[int, float]:
    """``class_weight`` with int keys (a saved config's JSON turned them to strings).

    Example:
        >>> class_weights({"1": 2, 0: 0.5})
        {1: 2.0, 0: 0.5}
    """
    _class_weights(value)
    return {int(k): float(v) for k, v in (value or {}).items()}


def _class_weights(value: Any) -> None:
    if value is None:
        return
    problem = "" if isinstance(value, dict) and value else "a non-empty dict"
    for key, weight in value.items() if isinstance(value, dict) else []:
        if isinstance(key, bool) or not (  # numpy ints too (np.unique of the labels)
            (isinstance(key, numbers.Integral) and int(key) >= 0)
            or (isinstance(key, str) and key.isdigit())
        ):
            problem = f"class indices (ints >= 0); {key!r} is not one"
        elif (
            isinstance(weight, bool)
            or not isinstance(weight, numbers.Real)
            or not (math.isfinite(float(weight)) and float(weight) >= 0)
        ):
            problem = f"finite weights >= 0; class {key!r} has {weight!r}"
    if problem:
        raise ConfigError(
            f"Expected class_weight to be a dict of class index to weight, with {problem}. "
            f"Received: class_weight={value!r}"
        )
