"""Validated settings of one fit, grouped by concern behind one flat keyword API.

:class:`TrainConfig` is what users pass (as keywords, or as the estimator's Spark ML
Params); it is frozen and keyword-only. Building it builds one small group per concern,
each validated at once (as Ray Train splits scaling, run and failure configs), so a
wrong setting fails on the driver before any Spark job starts:
:class:`SyncConfig` (mode, merge and their knobs), :class:`ScalingConfig`,
:class:`RunConfig`, :class:`FailureConfig`, :class:`ServiceConfig` and
:class:`CheckpointConfig`. What a fit then runs with, settings plus the cluster's facts,
is resolved once into a :class:`sparkdl.contract.plan.FitPlan`.

Example:
    >>> config = TrainConfig(epochs=5, num_workers=2, frequency=4)
    >>> config.frequency, config.sync.resolved_frequency, config.scaling.num_workers
    (4, 4, 2)
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Any

from sparkdl.errors import ConfigError
from sparkdl.protocol.client import DEFAULT_RETRIES, DEFAULT_TIMEOUT
from sparkdl.sync.codecs import resolve_codec
from sparkdl.sync.merges import STALENESS, merge_class
from sparkdl.sync.modes import DEFAULT_ROUND_TIMEOUT, MODES, Synchronous, mode_class
from sparkdl.sync.outer import OUTER_MERGES
from sparkdl.sync.outer import check as check_outer
from sparkdl.sync.recipe import check as check_recipe

__all__ = [
    "DATA_CACHES",
    "FREQUENCIES",
    "SERVICE_PLACEMENTS",
    "CheckpointConfig",
    "FailureConfig",
    "RunConfig",
    "ScalingConfig",
    "ServiceConfig",
    "SyncConfig",
    "TrainConfig",
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


@dataclass(frozen=True, kw_only=True)
class SyncConfig:
    """How workers sync: see :class:`TrainConfig` for each setting."""

    mode: str = Synchronous.name
    merge: str | None = None
    staleness: str = "none"
    elastic_alpha: float | None = None
    delta_scale: float | None = None
    frequency: str | int = "epoch"
    overlap: bool | None = None
    backup_workers: int = 0
    compression: str | None = None
    compression_ratio: float = 0.01
    lr_scaling: str | None = "auto"
    warmup_epochs: float = 0.0
    outer_optimizer: str | None = None
    outer_learning_rate: float | None = None
    outer_momentum: float | None = None
    sync_fragments: int = 1

    def __post_init__(self) -> None:
        mode = mode_class(self.mode)
        resolve_codec(self.compression, self.compression_ratio)  # a known name and ratio
        check_recipe(self.lr_scaling, self.warmup_epochs)
        if self.merge is None:
            object.__setattr__(self, "merge", mode.default_merge)
        merge_class(str(self.merge))
        if self.staleness not in STALENESS:
            raise ConfigError(
                f"Expected staleness to be one of {STALENESS}. "
                f"Received: staleness={self.staleness!r}"
            )
        _fraction("elastic_alpha", self.elastic_alpha)
        _fraction("delta_scale", self.delta_scale)
        self._check_outer()
        fragments = self.sync_fragments
        if (
            isinstance(fragments, bool)
            or not isinstance(fragments, int)
            or not 1 <= fragments <= MAX_SHARDS
        ):
            raise ConfigError(
                f"Expected sync_fragments to be an int in [1, {MAX_SHARDS}]. "
                f"Received: sync_fragments={fragments!r}"
            )
        if fragments > 1 and self.frequency == "epoch":
            raise ConfigError(
                f"sync_fragments={fragments} syncs one fragment at each sync within an "
                "epoch, but frequency='epoch' makes every sync an epoch's closing one, "
                "which carries every fragment. Set frequency to a number of batches "
                "(e.g. frequency=64), or drop sync_fragments."
            )
        freq = self.frequency
        if isinstance(freq, bool) or not (
            (isinstance(freq, int) and freq >= 1) or freq in FREQUENCIES
        ):
            raise ConfigError(
                f"Expected frequency to be one of {FREQUENCIES} or an int >= 1 (sync every "
                f"N batches). Received: frequency={freq!r}"
            )
        if self.overlap is not None and not isinstance(self.overlap, bool):
            raise ConfigError(
                f"Expected overlap to be True, False or None. Received: overlap={self.overlap!r}"
            )
        overlapping = tuple(m for m, c in _modes() if c.can_overlap)
        if self.overlap and not mode.can_overlap:
            raise ConfigError(
                f"overlap=True needs a mode whose workers push in the background, one of "
                f"{overlapping}: in mode={self.mode!r} every worker continues from the "
                "merged result of its round. Drop overlap or pick another mode."
            )
        backup = self.backup_workers
        if isinstance(backup, bool) or not isinstance(backup, int) or backup < 0:
            raise ConfigError(
                f"Expected backup_workers to be an int >= 0. Received: backup_workers={backup!r}"
            )
        if backup and not mode.barrier:
            barrier = tuple(m for m, c in _modes() if c.barrier)
            raise ConfigError(
                f"backup_workers={backup} needs a mode with rounds, one of {barrier}: "
                f"mode={self.mode!r} never waits for a slow worker. Drop backup_workers or "
                "change mode."
            )

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
        elif self.merge not in OUTER_MERGES:
            raise ConfigError(
                f"outer_optimizer={self.outer_optimizer!r} steps on the change a merge of "
                f"the workers' progress makes, one of {OUTER_MERGES}; merge={self.merge!r} "
                "has an outer step of its own (elastic_alpha). Use merge='average' or "
                "'delta', or drop outer_optimizer."
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

    num_workers: int | None = None
    threads_per_worker: int | None = None
    mixed_precision: bool = False
    slot_wait_timeout: float = 60.0
    data_cache: str = "auto"

    def __post_init__(self) -> None:
        if self.data_cache not in DATA_CACHES:
            raise ConfigError(
                f"Expected data_cache to be one of {list(DATA_CACHES)}. Received: "
                f"data_cache={self.data_cache!r}"
            )
        if self.num_workers is not None:
            _positive_int("num_workers", self.num_workers)
        if self.threads_per_worker is not None:
            _positive_int("threads_per_worker", self.threads_per_worker)
        _positive_number("slot_wait_timeout", self.slot_wait_timeout)


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """What one fit trains: epochs, batches, seeds, validation, reporting."""

    epochs: int = 1
    batch_size: int = 32
    seed: int | None = None
    verbose: int = 0
    shuffle: bool = True
    validate: bool = True
    validation_split: float = 0.0
    mlflow_run: bool | str | None = None
    class_weight: dict[Any, float] | None = None

    def __post_init__(self) -> None:
        _class_weights(self.class_weight)
        split = self.validation_split
        if isinstance(split, bool) or not isinstance(split, (int, float)) or not 0 <= split < 1:
            raise ConfigError(
                f"Expected validation_split to be a number in [0, 1). Received: "
                f"validation_split={split!r}"
            )
        _positive_int("epochs", self.epochs)
        _positive_int("batch_size", self.batch_size)
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int)
        ):
            raise ConfigError(f"Expected seed to be an int or None. Received: seed={self.seed!r}")
        if self.verbose not in (0, 1, 2):
            raise ConfigError(
                f"Expected verbose to be 0, 1 or 2. Received: verbose={self.verbose!r}"
            )


@dataclass(frozen=True, kw_only=True)
class FailureConfig:
    """How long to wait and how often to retry."""

    request_timeout: float = DEFAULT_TIMEOUT
    round_timeout: float = DEFAULT_ROUND_TIMEOUT
    request_retries: int = DEFAULT_RETRIES

    def __post_init__(self) -> None:
        _positive_number("request_timeout", self.request_timeout)
        _positive_number("round_timeout", self.round_timeout)
        retries = self.request_retries
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigError(f"Expected request_retries to be an int >= 0. Received: {retries!r}")


@dataclass(frozen=True, kw_only=True)
class ServiceConfig:
    """Where the parameter service listens."""

    service_host: str | None = None
    port: int = 0
    service_tls: bool | None = None
    service_placement: str = "auto"
    service_shards: int = 1

    def __post_init__(self) -> None:
        shards = self.service_shards
        if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
            raise ConfigError(
                f"Expected service_shards to be an int in [1, {MAX_SHARDS}]. "
                f"Received: service_shards={shards!r}"
            )
        if isinstance(self.port, int) and self.port and self.port + shards - 1 > 65535:
            raise ConfigError(
                f"service_shards={shards} listen on port={self.port} to "
                f"{self.port + shards - 1}, beyond 65535. Set a lower port, or port=0."
            )
        if self.service_placement not in SERVICE_PLACEMENTS:
            raise ConfigError(
                f"Expected service_placement to be one of {list(SERVICE_PLACEMENTS)}. "
                f"Received: service_placement={self.service_placement!r}"
            )
        if self.service_placement == "cluster" and self.service_host:
            raise ConfigError(
                f"service_host={self.service_host!r} names the driver's address, but "
                "service_placement='cluster' runs the service on an executor. Drop one."
            )
        if self.service_tls is not None and not isinstance(self.service_tls, bool):
            raise ConfigError(
                f"Expected service_tls to be True, False or None (on for a cluster, off "
                f"for a local master). Received: service_tls={self.service_tls!r}"
            )
        if (
            isinstance(self.port, bool)
            or not isinstance(self.port, int)
            or not 0 <= self.port < 65536
        ):
            raise ConfigError(
                f"Expected port to be an int in [0, 65535]. Received: port={self.port!r}"
            )


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Where checkpoints go and whether the fit resumes from them."""

    checkpoint_dir: str | None = None
    checkpoint_keep: int = 3
    resume: bool = False

    def __post_init__(self) -> None:
        _positive_int("checkpoint_keep", self.checkpoint_keep)
        if self.resume and not self.checkpoint_dir:
            raise ConfigError("resume=True needs checkpoint_dir= (where the checkpoints are).")


_GROUPS = {
    "sync": SyncConfig,
    "scaling": ScalingConfig,
    "run": RunConfig,
    "failure": FailureConfig,
    "service": ServiceConfig,
    "checkpointing": CheckpointConfig,
}


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything a fit needs besides the model and the data.

    Args:
        mode: How updates are scheduled. ``"synchronous"``: barrier rounds; every worker
            pushes, the service merges, every worker continues from the result.
            ``"asynchronous"``: first come first served, each update applied under a
            lock. ``"hogwild"``: first come first served, applied without a lock.
        merge: How the service combines updates. ``"average"``: weights averaged
            (synchronous: weighted by samples; asynchronous: each push moves the center
            1/num_workers of the way to the pushed weights). ``"delta"``: workers push
            ``w_new - w_pulled`` and the service adds it. ``"elastic"``: EASGD; worker
            and center move toward each other by ``elastic_alpha * (w - center)``.
            ``None``: ``"average"`` for synchronous mode, ``"delta"`` otherwise.
        staleness: ``"none"`` or ``"inverse"``: an asynchronous delta computed against
            a center k versions old is scaled by 1/k.
        elastic_alpha: The EASGD moving rate, in (0, 1]; ``None`` uses
            ``0.9 / num_workers`` (the fit's resolved value is in ``fit_report``).
        delta_scale: Asynchronous ``merge="delta"``: each worker multiplies its delta
            by this before pushing it. ``None``: 1/num_workers, which ``lr_scaling``
            makes up for with a higher rate on the workers; with ``lr_scaling=None``,
            1/num_workers only when a push spans a whole epoch (``frequency="epoch"``,
            or N at least an epoch's batches), where every worker's delta is a full
            epoch's travel from nearly the same center and adding them all overshoots
            by num_workers - 1 times, else 1 (textbook Downpour). Synchronous mode
            averages the round's deltas and ignores it.
        frequency: When workers sync: ``"epoch"``, ``"batch"`` or an int N (every N
            batches). Every epoch also ends with a sync.
        num_workers: Number of Spark tasks that train; ``None`` uses every task slot.
        epochs: Passes over the data.
        batch_size: Samples per gradient step on each worker.
        seed: Seed for weight shuffling and each worker's sample order.
        verbose: 0 prints nothing (the resolved settings go to the ``sparkdl.driver.fit``
            logger at INFO, as always); 1 prints them, then a progress bar on the driver
            (lines, as 2 does, without tqdm); 2 prints the resolved settings, then one
            line per finished epoch with its merged logs.
        shuffle: Shuffle each worker's samples every epoch.
        service_host: Address the parameter service binds to and workers call.
            ``None``: 127.0.0.1 for local masters, else ``spark.driver.host``.
        port: Port of the parameter service; 0 picks a free one.
        service_tls: Serve the parameter service over HTTPS with a certificate made
            for the fit and pinned by its workers (:mod:`sparkdl.server.web.tls`).
            ``None``: on unless the master is local (``local[...]``,
            ``local-cluster[...]``), where the traffic never leaves the machine.
        service_placement: Where the parameter service runs: ``"driver"`` (in this
            process; executors connect to it), ``"cluster"`` (inside the training job,
            beside worker 0, or workers 0..k-1 with ``service_shards=k``; this process
            follows the fit through Spark jobs only,
            so it never listens on a socket), or ``"auto"``: the driver on a classic
            session, the cluster on Spark Connect.
        service_shards: Split the weights over this many parameter services of about
            equal bytes (whole variables where they fit, large ones by rows); each
            worker pushes to and pulls from all of them at once, so no one service
            moves every byte (:mod:`sparkdl.sync.shards`). Synchronous fits give one
            service's weights (without top-k or sign compression, backup workers or
            timed-out rounds); asynchronous shards merge independently. With
            ``service_placement="driver"`` the shards are services in the driver
            process; with ``"cluster"``, shard j runs beside worker j (at most
            ``num_workers`` shards). With a set ``port``, shard j listens on
            ``port + j``.
        request_timeout: Seconds a worker waits for one service call (connect and read).
        round_timeout: Seconds a synchronous round waits for missing workers; then it
            closes with the workers present and logs a warning (their late pushes are
            dropped, as with ``backup_workers``).
        backup_workers: Synchronous mode: a round closes once all but this many workers
            pushed (Chen et al. 2016, backup workers); a push that arrives after its
            round closed is dropped and the worker continues from the current weights.
            The fit ends when the others finish every epoch.
        request_retries: Retries of a failed service call (connection errors, 5xx).
        threads_per_worker: TensorFlow intra-op threads per worker; ``None`` uses
            ``spark.task.cpus``. TensorFlow only: XLA on JAX sizes its own thread pool.
        slot_wait_timeout: Seconds to wait for executors to register before failing
            for lack of task slots (non-local masters only).
        validate: Before training, look at every feature and label value for NaNs
            (one pass over the data, in the aggregate job that also counts rows, nulls
            and ragged rows, which always runs). ``False`` skips that pass over every
            value; a NaN then shows up as a diverged loss.
        class_weight: ``{class index: weight}``, as ``model.fit(class_weight=...)``: each
            training row's loss is weighted by its label's class (a one-hot label's
            arg-max; a class left out weighs 1); validation is not. Single-output
            models; not together with ``weight_col`` (Keras refuses both too).
        validation_split: Fraction in [0, 1) of each worker's rows (its last ones, as
            in ``model.fit``) held out to report ``val_*`` logs every epoch.
        checkpoint_dir: A local directory on the driver; after every epoch the center
            weights, the epoch, the history and these settings are written there
            atomically (see :mod:`sparkdl.server.state.checkpoints`).
        checkpoint_keep: How many of the newest checkpoints to keep.
        resume: Continue from the newest checkpoint in ``checkpoint_dir`` (its weights
            and epoch count; the history continues) instead of from the model's weights.
        mlflow_run: ``True`` or a run name: log params, per-epoch metrics and the model
            to MLflow (see :mod:`sparkdl.driver.tracking`); ``None``: only when MLflow's Keras
            autologging is on; ``False``: never.
        mixed_precision: Workers compute in float16 with float32 variables (Keras's
            ``mixed_float16``; the loss is scaled). A Sequential or functional model
            keeps its output layers in float32; a subclassed model is built with
            ``mixed_float16`` as the default policy, so give its output layer
            ``dtype="float32"``. Worth it on GPUs with tensor cores; the fitted model
            computes in float32.
        data_cache: Where each worker keeps its partition while it trains.
            ``"memory"``: in memory (its float32 bytes, no more), batches gathered in
            a full random order each epoch. ``"disk"``: in an unnamed file under
            Spark's local directories, read back in blocks with a block-wise shuffle,
            so a worker's memory does not grow with its data. ``"auto"``: memory until
            the partition outgrows its budget (half of ``spark.executor.pyspark.memory``
            per task slot when that is set, else 1 GiB), then disk.
        overlap: Asynchronous and hogwild modes: a worker pushes in a background thread
            and keeps training; the answer is folded in at its next sync (the center
            plus the progress made meanwhile), so the round trip hides behind compute
            at the cost of one more update of staleness. An epoch's last push always
            waits for its answer, so every epoch starts from the center (and
            ``frequency="epoch"`` never overlaps). ``None``: on for asynchronous and
            hogwild modes. Synchronous rounds always wait for their result.
        compression: Updates travel compressed both ways: ``"fp16"``, ``"bf16"``,
            ``"topk"`` (the ``compression_ratio`` largest values of each array),
            ``"sign"`` (1 bit per value and two scales per array) or ``"int4"`` (4 bits
            per value and a scale per block of 64 values). What an encoding
            leaves out is added to the worker's next update (error feedback), and
            answers carry the center's change since the copy each worker holds
            (:mod:`sparkdl.sync.codecs`). ``None``: full float updates.
        compression_ratio: The fraction of each array's values a ``"topk"`` update
            keeps, in (0, 0.25].
        lr_scaling: Scale the model's learning rate so the fit moves as far per epoch as
            one process would (:mod:`sparkdl.sync.recipe`): by the merge's factor
            (``"linear"``, Goyal et al. 2017) or its square root (``"sqrt"``). The
            factor is ``num_workers`` for averaging and synchronous deltas,
            ``1 / delta_scale`` for asynchronous deltas (``num_workers`` by default)
            and ``num_workers + 1`` for elastic averaging.
            ``"auto"`` (the default): ``"linear"`` for ``keras.optimizers.SGD``,
            ``"sqrt"`` for adaptive optimizers (Adam, RMSprop, LARS...), none for a
            ``LearningRateSchedule``. ``None``: the model's rate as it is.
        warmup_epochs: With ``lr_scaling``, ramp the rate linearly from the model's to
            the scaled one over this many epochs (gradual warm-up).
        outer_optimizer: The service's own optimizer over what each merge moves
            (:mod:`sparkdl.sync.outer`): ``"nesterov"`` (DiLoCo), ``"sgd"`` (SlowMo's
            heavy-ball momentum) or ``None`` (the merge as it is). With
            ``merge="average"`` or ``"delta"``; synchronous rounds step on the round's
            change, asynchronous pushes as Delayed Nesterov (the momentum updated
            once every ``num_workers`` pushes). Pair it with infrequent syncs
            (``frequency`` of tens to hundreds of batches).
        outer_learning_rate: The outer optimizer's learning rate, > 0; ``None``: 0.7
            (DiLoCo's). ``outer_optimizer="sgd"`` with 1 and ``outer_momentum=0`` is
            the merge itself.
        outer_momentum: The outer optimizer's momentum, in [0, 1); ``None``: 0.9
            (DiLoCo's).
        sync_fragments: Split the weights into this many fragments of about equal bytes
            and sync one at a time, in turn (Streaming DiLoCo): each sync within an
            epoch pushes and pulls one fragment, so it carries 1/``sync_fragments`` of
            the bytes, and each fragment syncs every ``sync_fragments`` syncs; an
            epoch's closing sync carries every fragment, so it needs ``frequency`` in
            batches, several syncs an epoch. The fragments are the service's shards
            (``service_shards`` 1 or the same number).

    Raises:
        ConfigError: A value is out of range or unknown.

    Example:
        >>> TrainConfig(mode="synchronous", frequency="epoch", epochs=3).epochs
        3
    """

    mode: str = SyncConfig.mode
    merge: str | None = SyncConfig.merge
    staleness: str = SyncConfig.staleness
    elastic_alpha: float | None = SyncConfig.elastic_alpha
    delta_scale: float | None = SyncConfig.delta_scale
    frequency: str | int = SyncConfig.frequency
    num_workers: int | None = ScalingConfig.num_workers
    epochs: int = RunConfig.epochs
    batch_size: int = RunConfig.batch_size
    seed: int | None = RunConfig.seed
    verbose: int = RunConfig.verbose
    shuffle: bool = RunConfig.shuffle
    service_host: str | None = ServiceConfig.service_host
    port: int = ServiceConfig.port
    service_tls: bool | None = ServiceConfig.service_tls
    service_placement: str = ServiceConfig.service_placement
    service_shards: int = ServiceConfig.service_shards
    request_timeout: float = FailureConfig.request_timeout
    round_timeout: float = FailureConfig.round_timeout
    backup_workers: int = SyncConfig.backup_workers
    request_retries: int = FailureConfig.request_retries
    threads_per_worker: int | None = ScalingConfig.threads_per_worker
    slot_wait_timeout: float = ScalingConfig.slot_wait_timeout
    validate: bool = RunConfig.validate
    validation_split: float = RunConfig.validation_split
    checkpoint_dir: str | None = CheckpointConfig.checkpoint_dir
    checkpoint_keep: int = CheckpointConfig.checkpoint_keep
    resume: bool = CheckpointConfig.resume
    mlflow_run: bool | str | None = RunConfig.mlflow_run
    class_weight: dict[Any, float] | None = RunConfig.class_weight
    mixed_precision: bool = ScalingConfig.mixed_precision
    overlap: bool | None = SyncConfig.overlap
    data_cache: str = ScalingConfig.data_cache
    compression: str | None = SyncConfig.compression
    compression_ratio: float = SyncConfig.compression_ratio
    lr_scaling: str | None = SyncConfig.lr_scaling
    warmup_epochs: float = SyncConfig.warmup_epochs
    outer_optimizer: str | None = SyncConfig.outer_optimizer
    outer_learning_rate: float | None = SyncConfig.outer_learning_rate
    outer_momentum: float | None = SyncConfig.outer_momentum
    sync_fragments: int = SyncConfig.sync_fragments
    # The same settings by concern, each group validated when the config is built.
    sync: SyncConfig = field(init=False, repr=False, compare=False)
    scaling: ScalingConfig = field(init=False, repr=False, compare=False)
    run: RunConfig = field(init=False, repr=False, compare=False)
    failure: FailureConfig = field(init=False, repr=False, compare=False)
    service: ServiceConfig = field(init=False, repr=False, compare=False)
    checkpointing: CheckpointConfig = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for attr, group in _GROUPS.items():
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
    """The fields of :class:`TrainConfig` a user sets (its keyword arguments).

    Example:
        >>> [f.name for f in setting_fields()][:3]
        ['mode', 'merge', 'staleness']
    """
    return [f for f in dataclasses.fields(TrainConfig) if f.init]


def setting_docs() -> dict[str, str]:
    """Each setting's description, from the ``Args:`` section of :class:`TrainConfig`.

    The one place a setting is described: the settings reference of the docs, the
    Params' docs (``explainParams()``) and ``python -m sparkdl --help`` read it here.

    Returns:
        Setting name -> its description as one paragraph (reST inline markup kept).

    Raises:
        AssertionError: A setting has no description (caught by the unit tests).

    Example:
        >>> setting_docs()["epochs"]
        'Passes over the data.'
    """
    doc = TrainConfig.__doc__ or ""
    args = doc.split("Args:", 1)[1].split("Raises:", 1)[0]
    docs: dict[str, str] = {}
    name = None
    for line in args.splitlines():
        match = re.match(r"^ {8}(\w+): ?(.*)$", line)
        if match:
            name = match.group(1)
            docs[name] = match.group(2).strip()
        elif name and line.strip():
            docs[name] += " " + line.strip()
    missing = [f.name for f in setting_fields() if f.name not in docs]
    assert not missing, f"TrainConfig's docstring describes no {missing}"
    return docs


def _modes() -> list[tuple[str, Any]]:
    return list(MODES.items())


def _fraction(name: str, value: Any) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1
    ):
        raise ConfigError(
            f"Expected {name} to be a number in (0, 1] or None. Received: {name}={value!r}"
        )


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


def _positive_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"Expected {name} to be a number > 0. Received: {name}={value!r}")


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"Expected {name} to be an int >= 1. Received: {name}={value!r}")
