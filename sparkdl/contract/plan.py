"""A fit's plan: the user's settings and the cluster's facts, resolved once on the driver.

Every default that depends on the fit (the number of workers, whether a push spans a
whole epoch, the delta scale, the elastic moving rate, overlap, TensorFlow threads, the
service's address) is decided here, once, and the frozen plan travels to every worker
unchanged; no worker or service code resolves a setting again.

Example:
    >>> from sparkdl.config import TrainConfig
    >>> plan = FitPlan.resolve(TrainConfig(mode="asynchronous", merge="delta"),
    ...                        num_workers=2, rows=1000, threads=1, service_host="127.0.0.1")
    >>> plan.mode.name, plan.merge, plan.whole_epoch
    ('asynchronous', Delta(staleness='none', scale=0.5), True)
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparkdl.contract.backends import training_backend
from sparkdl.contract.tf_logs import TensorFlowLogs
from sparkdl.errors import ConfigError
from sparkdl.sync.codecs import Compression
from sparkdl.sync.merges import Merge, merge_class
from sparkdl.sync.modes import Mode, mode_class
from sparkdl.sync.outer import OuterOptimizer
from sparkdl.sync.recipe import LearningRateRecipe, resolve_scaling
from sparkdl.sync.schedule import steps_for, train_rows
from sparkdl.sync.settings import FitSettings

_log = logging.getLogger("sparkdl.fit")  # the fit's documented logger

if TYPE_CHECKING:
    from sparkdl.config import TrainConfig

__all__ = ["DEFAULT_CACHE_BUDGET", "FitPlan", "format_resolved"]

#: Bytes of its partition a worker keeps in memory under ``data_cache="auto"`` when
#: nothing caps Python's memory (:func:`sparkdl.driver.cluster.cache_budget` resolves it).
DEFAULT_CACHE_BUDGET = 1 << 30


def _as_given(*, default: Any = dataclasses.MISSING) -> Any:
    """A field of :class:`FitPlan` that takes the user's setting of the same name as it
    is (:meth:`FitPlan.resolve` copies every such field from the config)."""
    return field(default=default, metadata={"as_given": True})


def _given(f: dataclasses.Field[Any]) -> bool:
    return bool(f.metadata.get("as_given"))


@dataclass(frozen=True, kw_only=True)
class FitPlan:
    """Everything a fit runs with besides the model and the data, resolved.

    ``epochs``, ``batch_size``, ``shuffle``, ``seed``, ``mixed_precision``,
    ``request_timeout``, ``request_retries``, ``round_timeout``, ``backup_workers``,
    ``port`` and ``data_cache`` are the user's settings of those names as given, which
    :meth:`resolve` copies (each is described where it is declared:
    :class:`~sparkdl.config.TrainConfig`); the other fields are resolved.

    Attributes:
        mode: The mode object (its service and worker halves).
        merge: The merge object, its settings resolved (scale, alpha, share).
        compression: The codecs updates travel in, each way, or ``None``
            (:mod:`sparkdl.sync.codecs`).
        lr_recipe: The workers' learning rate against the model's (``lr_scaling``,
            ``warmup_epochs``; :mod:`sparkdl.sync.recipe`).
        num_workers: Spark tasks that train.
        initial_epoch: Epochs done before this fit (a resumed fit starts after them).
        frequency: Batches between syncs, or ``None`` for epoch ends only.
        whole_epoch: Whether a push spans a whole epoch of a worker (at an even split).
        overlap: Workers push in the background and fold the answer in later.
        validation_split: Fraction of each worker's rows held out (0 when validation
            data is given).
        threads: TensorFlow intra-op threads per worker.
        service_host: Address the service binds to and workers call.
        service_tls: The service speaks HTTPS (``TrainConfig.service_tls`` resolved).
        service_placement: ``"driver"`` or ``"cluster"`` (``TrainConfig.
            service_placement`` resolved: :mod:`sparkdl.executor.hosting`).
        service_shards: Parameter services the weights split over
            (:mod:`sparkdl.sync.shards`).
        outer: The service's outer optimizer (:mod:`sparkdl.sync.outer`), or ``None``.
        fragments: Fragments synced in turn (``sync_fragments``): each is one of the
            service's shards.
        cache_budget: Bytes of its partition an ``"auto"`` worker keeps in memory.
        tf_logs: How workers load TensorFlow: its C++ log level, and whether its
            load-time lines are filtered (:mod:`sparkdl.contract.tf_logs`).
        backend: The Keras backend the workers run, the driver's
            (:func:`~sparkdl.contract.backends.training_backend`).
    """

    mode: Mode
    merge: Merge
    compression: Compression | None = None
    lr_recipe: LearningRateRecipe = field(default_factory=LearningRateRecipe)
    num_workers: int
    epochs: int = _as_given()
    initial_epoch: int = 0
    batch_size: int = _as_given()
    frequency: int | None
    whole_epoch: bool
    overlap: bool
    shuffle: bool = _as_given()
    seed: int | None = _as_given()
    validation_split: float
    threads: int
    mixed_precision: bool = _as_given()
    request_timeout: float = _as_given()
    request_retries: int = _as_given()
    round_timeout: float = _as_given()
    backup_workers: int = _as_given()
    service_host: str
    port: int = _as_given()
    service_tls: bool = False
    service_placement: str = "driver"
    service_shards: int = 1
    outer: OuterOptimizer | None = None
    fragments: int = 1
    data_cache: str = _as_given(default="auto")
    cache_budget: int = DEFAULT_CACHE_BUDGET
    tf_logs: TensorFlowLogs = field(default_factory=TensorFlowLogs)
    backend: str = "tensorflow"

    @classmethod
    def resolve(
        cls,
        config: TrainConfig,
        *,
        num_workers: int,
        rows: int,
        threads: int,
        service_host: str,
        initial_epoch: int = 0,
        validation_data: bool = False,
        cache_budget: int = DEFAULT_CACHE_BUDGET,
        tf_logs: TensorFlowLogs | None = None,
        local_master: bool = True,
        optimizer: str = "sgd",
        service_placement: str = "driver",
        optimizer_config: str = "",
        trainable: tuple[bool, ...] = (),
        weight_paths: tuple[str, ...] = (),
    ) -> FitPlan:
        """Resolves ``config`` for a fit over ``rows`` rows on ``num_workers`` workers.

        Args:
            config: The user's settings.
            num_workers: Workers of the fit (checked against the cluster's slots).
            rows: Rows of the training data.
            threads: TensorFlow threads per worker (``threads_per_worker`` or the
                cluster's ``spark.task.cpus``).
            service_host: The service's address for this cluster.
            initial_epoch: Epochs done before (a resumed fit).
            validation_data: Validation rows are given apart from the training rows.
            cache_budget: Bytes of its partition a worker may keep in memory
                (:func:`sparkdl.driver.cluster.cache_budget`).
            tf_logs: How workers load TensorFlow
                (:class:`~sparkdl.contract.tf_logs.TensorFlowLogs`).
            local_master: The master is local (``service_tls=None`` then means off).
            optimizer: The model's optimizer kind, for ``lr_scaling="auto"``
                (:func:`sparkdl.contract.keras_io.optimizer_kind`).
            service_placement: ``"driver"`` or ``"cluster"``, resolved from the
                setting's ``"auto"`` by the session's kind.
            optimizer_config: The compiled optimizer, serialized
                (:func:`sparkdl.contract.keras_io.optimizer_config`), for
                ``outer_optimizer="model"``.
            trainable: Which of the model's weights are trainable
                (:func:`sparkdl.contract.keras_io.trainable_flags`), for the same.
            weight_paths: The model's weight paths
                (:func:`sparkdl.contract.keras_io.weight_paths`), for the same.

        Raises:
            ConfigError: ``backup_workers`` leaves no worker for a round.
        """
        _check_backups(config.backup_workers, num_workers)
        split = 0.0 if validation_data else float(config.validation_split)
        settings = _settings(config, num_workers, rows, split, optimizer)
        mode = mode_class(config.mode).resolve(settings)
        merge = merge_class(str(config.merge)).resolve(settings)
        outer = None if config.outer_optimizer is None else OuterOptimizer.resolve(settings)
        _warn_outer_amplifies(config, settings, merge, outer)
        _warn_fragments_in_whole_epochs(config, settings, rows, split)
        recipe = LearningRateRecipe.of_resolved(
            config.lr_scaling,
            settings.lr_scaling,
            config.warmup_epochs,
            lr_factor=merge.lr_factor(num_workers, mode.barrier),
            optimizer=optimizer,
            synchronous=mode.barrier,
        )
        if outer is not None and outer.steps_model:  # the service scales the model's rate
            outer = outer.of_model(optimizer_config, trainable, recipe.factor, weight_paths)
        return cls(
            **{f.name: getattr(config, f.name) for f in dataclasses.fields(cls) if _given(f)},
            mode=mode,
            merge=merge,
            compression=None if config.compression is None else Compression.resolve(settings),
            lr_recipe=recipe,
            num_workers=num_workers,
            initial_epoch=initial_epoch,
            frequency=config.sync.resolved_frequency,
            whole_epoch=settings.whole_epoch,
            overlap=config.sync.resolved_overlap,
            validation_split=split,
            threads=config.threads_per_worker or threads,
            service_host=config.service_host or service_host,
            # service_tls None: on unless the master is local
            service_tls=not local_master if config.service_tls is None else config.service_tls,
            service_placement=service_placement,
            service_shards=_shards(config, service_placement, num_workers),
            outer=outer,
            fragments=config.sync_fragments,
            cache_budget=cache_budget,
            tf_logs=tf_logs or TensorFlowLogs(),
            backend=training_backend(),
        )

    @property
    def steps_model(self) -> bool:
        """The model's compiled optimizer steps the center on the service
        (``outer_optimizer="model"``); the workers' own steps are plain, at rate 1."""
        return self.outer is not None and self.outer.steps_model

    @property
    def hosted(self) -> bool:
        """The service runs inside the training job (``service_placement="cluster"``)."""
        return self.service_placement == "cluster"

    def held_in(self, rows: int) -> int:
        """Of ``rows`` rows of a worker (or of the fit), those ``model.fit`` trains on:
        all but the last ``validation_split`` of them (:func:`~sparkdl.sync.schedule.
        train_rows`), the one place the fit's split is applied."""
        return train_rows(rows, self.validation_split)

    def describe(self, learning_rate: float | None) -> dict[str, str]:
        """What the fit resolved from the user's settings, in words, one entry a line.

        The fit logs it at INFO (logger ``sparkdl.driver.fit``) at its start, prints it too
        with ``verbose >= 1``, and keeps it in ``fit_report["resolved"]``: the settings
        that change what the user compiled (the workers' learning rate, a delta's
        scale) are never applied silently.

        Args:
            learning_rate: The compiled (or ``learning_rate``-overridden) rate, or
                ``None`` when a schedule gives it.

        Example:
            >>> from sparkdl.config import TrainConfig
            >>> plan = FitPlan.resolve(TrainConfig(), num_workers=2, rows=100, threads=1,
            ...                        service_host="127.0.0.1")
            >>> plan.describe(0.01)["learning rate"].split(" (")[0]
            'workers train at 0.02 = the compiled 0.01 x 2'
        """
        mode, merge = self.mode, self.merge
        sync = (
            "every epoch"
            if self.frequency is None
            else "every batch"
            if self.frequency == 1
            else f"every {self.frequency} batches"
        )
        if self.fragments > 1:
            sync += f", one of {self.fragments} fragments a sync (every one at an epoch's end)"
        if self.overlap:
            sync += ", pushes overlap training"
        if self.backup_workers:
            sync += f", a round closes without the last {self.backup_workers} worker(s)"
        lines = {
            "workers": f"{self.num_workers}, {mode.name} / {merge.name}, sync {sync}",
            "backend": f"Keras on {self.backend} (the driver's)",
            "learning rate": self.lr_recipe.explain(learning_rate),
        }
        if self.steps_model:
            lines["learning rate"] = (
                "the service's optimizer steps at "
                + self.lr_recipe.explain(learning_rate).split(" at ", 1)[1]
                + "; workers take plain gradient steps (SGD, rate 1)"
            )
        merged = merge.describe(mode.barrier)
        if merged:
            lines["merge"] = f"{merge.name}: {merged}"
        if self.outer is not None:
            when = (
                "once per round"
                if self.outer.steps_model
                else "on each round's change"
                if mode.barrier
                else f"on each push, momentum once every {self.num_workers} pushes "
                "(Delayed Nesterov)"
            )
            lines["outer optimizer"] = f"{self.outer.describe()}, {when}"
        lines["compression"] = _compression(self.compression)
        lines["data cache"] = (
            f"auto: each worker's partition in memory up to {_gib(self.cache_budget)}, then on disk"
            if self.data_cache == "auto"
            else self.data_cache
        )
        scheme = "HTTPS (per-fit certificate)" if self.service_tls else "HTTP"
        where = (
            "in the cluster, beside worker 0 (followed through Spark jobs)"
            if self.hosted
            else self.service_host
        )
        shards = f", {self.service_shards} shards" if self.service_shards > 1 else ""
        lines["service"] = f"{where}, {scheme}{shards}"
        return lines


def _settings(
    config: TrainConfig, num_workers: int, rows: int, split: float, optimizer: str
) -> FitSettings:
    """What the fit's mode, merge, codecs and outer optimizer are resolved from: the
    settings (``lr_scaling`` resolved for the model's ``optimizer``), the workers, whether
    pushes merge in rounds and whether one spans a whole epoch of a worker."""
    frequency = config.sync.resolved_frequency
    synchronous = mode_class(config.mode).barrier
    per_worker = train_rows(math.ceil(rows / max(num_workers, 1)), split)
    whole_epoch = frequency is None or frequency >= steps_for(per_worker, config.batch_size)
    return FitSettings(
        {
            **config.to_dict(),
            "lr_scaling": resolve_scaling(config.lr_scaling, optimizer, synchronous=synchronous),
        },
        num_workers=num_workers,
        synchronous=synchronous,
        whole_epoch=whole_epoch,
    )


def _warn_outer_amplifies(
    config: TrainConfig, settings: FitSettings, merge: Merge, outer: OuterOptimizer | None
) -> None:
    """Warns when an outer optimizer amplifies asynchronous deltas added in full."""
    amplifies = outer is not None and (outer.momentum > 0 or outer.learning_rate > 1)
    in_full = getattr(merge, "scale", None) == 1.0
    if not (amplifies and in_full and not settings.synchronous and settings.num_workers > 1):
        return
    fix = (
        "Lower delta_scale"
        if config.delta_scale is not None
        else "Keep lr_scaling='auto' (deltas divided by num_workers) or set delta_scale"
    )
    _log.warning(
        "outer_optimizer=%r amplifies each asynchronous delta, which is added "
        "in full here (delta_scale=1): with %d workers the center may "
        "overshoot. %s.",
        config.outer_optimizer,
        settings.num_workers,
        fix,
    )


def _warn_fragments_in_whole_epochs(
    config: TrainConfig, settings: FitSettings, rows: int, split: float
) -> None:
    """Warns when ``sync_fragments`` has no sync within an epoch to spread over."""
    if config.sync_fragments > 1 and settings.whole_epoch:
        per_worker = train_rows(math.ceil(rows / max(settings.num_workers, 1)), split)
        _log.warning(
            "sync_fragments=%d: with frequency=%s a worker makes no sync within an "
            "epoch (about %d batches), so every sync carries every fragment and the "
            "fragments only add requests. Sync more often than once an epoch.",
            config.sync_fragments,
            config.frequency,
            steps_for(per_worker, config.batch_size),
        )


def _shards(config: TrainConfig, placement: str, num_workers: int) -> int:
    """The service's shards (``service_shards``, or ``sync_fragments``, whose fragments
    are the shards), checked against where the service runs.

    Raises:
        ConfigError: More shards in the cluster than workers to host them.
    """
    shards = max(config.service_shards, config.sync_fragments)
    setting = "sync_fragments" if config.sync_fragments > 1 else "service_shards"
    if shards > num_workers and placement == "cluster":
        raise ConfigError(
            f"{setting}={shards} with service_placement='cluster' needs a worker "
            f"to host each shard, and the fit has num_workers={num_workers} (set, or "
            "the cluster's task slots, less one for the relay's polls when callbacks, "
            f"checkpoints or verbose are on). Use at most {num_workers}, or more workers."
        )
    return shards


def _check_backups(backup_workers: int, num_workers: int) -> None:
    """Refuses ``backup_workers`` that leave a round no worker to wait for.

    Raises:
        ConfigError: ``backup_workers >= num_workers``.
    """
    if backup_workers >= num_workers:
        raise ConfigError(
            f"backup_workers={backup_workers} must be smaller than the number of "
            f"workers ({num_workers}): a round needs at least one worker."
        )


def format_resolved(lines: dict[str, str]) -> str:
    """:meth:`FitPlan.describe`'s lines as the block a fit prints at its start.

    Example:
        >>> print(format_resolved({"workers": "2", "compression": "none"}))
        sparkdl fit, resolved:
          workers      2
          compression  none
    """
    width = max(len(key) for key in lines) + 2
    body = "\n".join(f"  {key:<{width}}{text}" for key, text in lines.items())
    return "sparkdl fit, resolved:\n" + body


def _compression(compression: Compression | None) -> str:
    if compression is None:
        return "none: updates travel as full floats"
    push, answer = compression.push, compression.answer
    kept = ""
    ratio, answer_ratio = getattr(push, "ratio", None), getattr(answer, "ratio", None)
    if ratio is not None:
        kept = f" (pushes keep {ratio:.3g} of each array, answers {answer_ratio:.3g})"
    return f"{push.name}{kept}, with error feedback"


def _gib(size: int) -> str:
    return f"{size / (1 << 30):.3g} GiB" if size >= 1 << 30 else f"{size / (1 << 20):.0f} MiB"
