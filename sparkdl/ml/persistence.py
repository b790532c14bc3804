"""Saving and loading KerasEstimator / KerasModel the Spark ML way.

A saved stage is a directory, written through Hadoop's FileSystem API so any path Spark
can write works (local, ``file://``, HDFS, DBFS, object stores):

* ``metadata/``: Spark ML's Params metadata (``DefaultParamsWriter``), so
  ``Pipeline`` / ``PipelineModel`` persistence finds and loads the stage;
* ``model.keras``: the Keras model in its native format;
* ``state.json``: history, fit report and input shape (models only);
* ``custom_objects.pkl``: the cloudpickled ``custom_objects``, when there are any.

A Spark Connect client has no FileSystem handle (nor a ``SparkContext``): it writes
each file as a one-file Parquet dataset of its bytes in chunks, under the same name,
through the DataFrame writer (``mode("overwrite")`` for ``write().overwrite()``, which
PySpark's own ``MLWriter`` cannot do over Connect), and reads a file with Spark's
``binaryFile`` source. The reader takes either layout on either kind of session.

Loading is safe by default: ``KerasModel.load(path)`` (and ``read().load``, and a
``Pipeline`` holding the stage) loads ``model.keras`` in Keras's safe mode, which
refuses to run code a file carries (a ``Lambda`` layer's bytecode), on the driver and
on every executor that scores with it, and does not unpickle ``custom_objects.pkl``
(unpickling runs code): pass ``custom_objects={...}`` to load instead, or
``safe_mode=False`` to unpickle it and allow ``Lambda`` layers, for a directory you
(or someone you trust) saved.

Example:
    >>> sorted(FILES)
    ['custom_objects', 'model', 'state']
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark import SparkContext
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReader, MLWriter

from sparkdl.compat.sessions import is_connect
from sparkdl.compat.spark import hadoop_filesystem, params_metadata, read_all_bytes, reset_uid
from sparkdl.errors import ModelError

__all__ = [
    "FILES",
    "Loading",
    "Persistable",
    "StageReader",
    "StageWriter",
    "exists",
    "loading_options",
    "read_bytes",
    "write_bytes",
]

FILES = {
    "model": "model.keras",
    "state": "state.json",
    "custom_objects": "custom_objects.pkl",
}
_CHUNK = 8 << 20


def write_bytes(sc: SparkContext, path: str, data: bytes) -> None:
    """Writes ``data`` to ``path`` through Hadoop's FileSystem (overwriting it)."""
    fs, target = hadoop_filesystem(sc, path)
    out = fs.create(target, True)
    try:
        for start in range(0, len(data), _CHUNK):
            out.write(data[start : start + _CHUNK])
    finally:
        out.close()


def read_bytes(sc: SparkContext, path: str) -> bytes:
    """Reads the whole file at ``path`` through Hadoop's FileSystem."""
    fs, source = hadoop_filesystem(sc, path)
    stream = fs.open(source)
    try:
        return read_all_bytes(sc, stream)
    finally:
        stream.close()


def exists(sc: SparkContext, path: str) -> bool:
    """Whether ``path`` exists (through Hadoop's FileSystem)."""
    fs, target = hadoop_filesystem(sc, path)
    return bool(fs.exists(target))


class Persistable:
    """Spark ML ``write()`` / ``read()`` for a stage that lists its files.

    The stage implements ``_persisted_files()`` (key of :data:`FILES` -> bytes or
    ``None``) and the classmethod ``_from_persisted(files, loading)``.
    """

    def write(self) -> StageWriter:
        """A Spark ML writer: ``stage.write().overwrite().save(path)``."""
        return StageWriter(self)

    @classmethod
    def read(
        cls, *, safe_mode: bool | None = None, custom_objects: dict[str, Any] | None = None
    ) -> StageReader:
        """A Spark ML reader: ``Stage.read().load(path)`` (see :meth:`load`)."""
        return StageReader(cls, _current(safe_mode, custom_objects))

    @classmethod
    def load(
        cls,
        path: str,
        *,
        safe_mode: bool | None = None,
        custom_objects: dict[str, Any] | None = None,
    ) -> Any:
        """Loads a stage saved with ``write().save(path)``.

        Args:
            path: The directory (any path Spark's Hadoop FileSystem reads).
            safe_mode: Keras's safe mode for ``model.keras``: a ``Lambda`` layer's code
                is refused, and ``custom_objects.pkl`` is not unpickled. Pass ``False``
                only for a directory you trust: both run code. ``None``: as
                :func:`loading_options` says in the block around, else on.
            custom_objects: The custom objects to load the model with (instead of the
                saved pickle; objects registered with Keras need none).

        Raises:
            ModelError: The stage was saved with custom objects and neither
                ``custom_objects`` nor ``safe_mode=False`` was given, or the model
                holds code safe mode refuses.

        Example:
            >>> from sparkdl import KerasModel
            >>> KerasModel.load("/tmp/model", custom_objects={})  # doctest: +SKIP
        """
        return cls.read(safe_mode=safe_mode, custom_objects=custom_objects).load(path)


class StageWriter(MLWriter):
    """Writes a stage's Params metadata plus its Keras model and state files."""

    def __init__(self, instance: Any) -> None:
        super().__init__()
        self.instance = instance

    def save(self, path: str) -> None:
        if not is_connect(self.sparkSession):
            super().save(path)
            return
        spark = self.sparkSession
        mode = "overwrite" if self.shouldOverwrite else "error"
        metadata = params_metadata(self.instance, spark)
        frame = spark.createDataFrame([(metadata,)], "value string").coalesce(1)
        frame.write.mode(mode).text(f"{path}/metadata")
        for key, data in self.instance._persisted_files().items():
            # Every file, an absent one as no rows: an overwrite leaves no stale file.
            _write_chunks(spark, f"{path}/{FILES[key]}", data or b"", mode)

    def saveImpl(self, path: str) -> None:
        sc = self.sparkSession.sparkContext
        DefaultParamsWriter.saveMetadata(self.instance, path, sc)
        files = self.instance._persisted_files()
        for key, data in files.items():
            if data is not None:
                write_bytes(sc, f"{path}/{FILES[key]}", data)


@dataclass(frozen=True)
class Loading:
    """How a stage is loaded (:meth:`Persistable.load`)."""

    safe_mode: bool = True
    custom_objects: dict[str, Any] | None = None

    def custom(self, pickled: bytes | None) -> dict[str, Any] | None:
        """The custom objects to load with: the given ones, else the saved pickle
        outside safe mode; in safe mode none (objects registered with Keras in this
        process still load)."""
        if self.custom_objects is not None:
            return self.custom_objects
        if not pickled or self.safe_mode:
            return None
        import cloudpickle

        loaded: dict[str, Any] = cloudpickle.loads(pickled)
        return loaded

    def load_model(
        self, model_bytes: bytes, custom: dict[str, Any] | None, pickled: bytes | None, path: str
    ) -> Any:
        """The stage's Keras model, loaded with ``custom`` (from :meth:`custom`).

        Raises:
            ModelError: Safe mode left out a saved pickle the model needs, or refused
                code the model holds.
        """
        from sparkdl.contract import keras_io

        try:
            return keras_io.model_from_bytes(model_bytes, custom, safe_mode=self.safe_mode)
        except Exception as exc:
            if not (pickled and self.safe_mode and self.custom_objects is None):
                raise
            found = re.search(r"Could not locate (class|function) '[^']+'", str(exc))
            reason = found.group(0) if found else str(exc).splitlines()[0][:200]
            raise ModelError(
                f"The stage at {path} was saved with custom_objects, in "
                f"{FILES['custom_objects']}, a pickle: unpickling it runs code, so a safe "
                f"load leaves it out, and the model did not load without it ({reason}). Load "
                "it with custom_objects={...} (the objects, defined or imported here), or "
                "with safe_mode=False if you trust whoever saved it; a Pipeline's stages "
                "take them from sparkdl.loading_options(...)."
            ) from exc


_options = threading.local()


@contextlib.contextmanager
def loading_options(
    *, safe_mode: bool = True, custom_objects: dict[str, Any] | None = None
) -> Iterator[None]:
    """Settings for every stage loaded in the block (in this thread), for loads that
    cannot take arguments: a ``PipelineModel``'s or a ``CrossValidatorModel``'s stages.

    Example:
        >>> from pyspark.ml import PipelineModel
        >>> with loading_options(custom_objects={"MyLayer": object}):  # doctest: +SKIP
        ...     pipeline = PipelineModel.load("/tmp/pipeline")
    """
    previous = getattr(_options, "value", None)
    _options.value = Loading(safe_mode=safe_mode, custom_objects=custom_objects)
    try:
        yield
    finally:
        _options.value = previous


def _current(safe_mode: bool | None, custom_objects: dict[str, Any] | None) -> Loading:
    """What a load without arguments uses: the block's :func:`loading_options`, or
    safe mode."""
    base: Loading = getattr(_options, "value", None) or Loading()
    return Loading(
        safe_mode=base.safe_mode if safe_mode is None else safe_mode,
        custom_objects=base.custom_objects if custom_objects is None else custom_objects,
    )


class StageReader(MLReader):
    """Reads what :class:`StageWriter` wrote and rebuilds the stage."""

    def __init__(self, cls: Any, loading: Loading | None = None) -> None:
        super().__init__()
        self.cls = cls
        self.loading = loading or Loading()

    def load(self, path: str) -> Any:
        spark = self.sparkSession
        # PySpark 3.5 reads metadata through a SparkContext; Connect has only the session.
        metadata = DefaultParamsReader.loadMetadata(
            path, spark if is_connect(spark) else spark.sparkContext
        )
        files = {key: _read_file(spark, f"{path}/{name}") for key, name in FILES.items()}
        instance = self.cls._from_persisted(files, self.loading, path)
        reset_uid(instance, metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        return instance


def dump_state(state: dict[str, Any]) -> bytes:
    """JSON bytes of a stage's state (history, fit report, input shape)."""
    return json.dumps(state, default=_jsonable).encode()


def load_state(data: bytes | None) -> dict[str, Any]:
    """The state :func:`dump_state` wrote (``{}`` when absent)."""
    if not data:
        return {}
    state: dict[str, Any] = json.loads(data)
    return state


def _write_chunks(spark: Any, path: str, data: bytes, mode: str) -> None:
    """``data`` at ``path`` as a one-file Parquet dataset of ``(chunk, data)`` rows."""
    rows = [(i, data[at : at + _CHUNK]) for i, at in enumerate(range(0, len(data), _CHUNK))]
    frame = spark.createDataFrame(rows, "chunk int, data binary").coalesce(1)
    frame.write.mode(mode).parquet(path)


def _read_file(spark: Any, path: str) -> bytes | None:
    """A stage file's bytes (``None`` when absent or empty), in either layout: a file,
    or the Parquet dataset :func:`_write_chunks` wrote."""
    if not is_connect(spark):
        sc = spark.sparkContext
        if not exists(sc, path):
            return None
        fs, target = hadoop_filesystem(sc, path)
        if not fs.getFileStatus(target).isDirectory():
            return read_bytes(sc, path)
        return _read_chunks(spark, path)
    from pyspark.errors import AnalysisException

    try:
        found = spark.read.format("binaryFile").load(path).select("path").collect()
    except AnalysisException as exc:
        if exc.getCondition() == "PATH_NOT_FOUND":
            return None
        raise
    if len(found) == 1 and str(found[0][0]).rstrip("/").endswith(
        "/" + path.rstrip("/").split("/")[-1]
    ):
        content = spark.read.format("binaryFile").load(path).select("content").collect()
        return bytes(content[0][0]) or None
    return _read_chunks(spark, path)


def _read_chunks(spark: Any, path: str) -> bytes | None:
    rows = spark.read.parquet(path).orderBy("chunk").select("data").collect()
    return b"".join(bytes(row[0]) for row in rows) or None


def _jsonable(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)
