"""Saving and loading KerasEstimator / KerasModel the Spark ML way.

A saved stage is a directory, written through Hadoop's FileSystem API so any path Spark
can write works (local, ``file://``, HDFS, DBFS, object stores):

* ``metadata/``: Spark ML's Params metadata (``DefaultParamsWriter``), so
  ``Pipeline`` / ``PipelineModel`` persistence finds and loads the stage;
* ``model.keras``: the Keras model in its native format;
* ``state.json``: history, fit report and input shape (models only);
* ``custom_objects.pkl``: the cloudpickled ``custom_objects``, when there are any.
  Loading unpickles this file: load only directories you (or someone you trust) saved.

Example:
    >>> sorted(FILES)
    ['custom_objects', 'model', 'state']
"""

from __future__ import annotations

import json
from typing import Any

from pyspark import SparkContext
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReader, MLWriter

from sparkdl.compat.spark import hadoop_filesystem, read_all_bytes

__all__ = [
    "FILES",
    "Persistable",
    "StageReader",
    "StageWriter",
    "exists",
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
    ``None``) and the classmethod ``_from_persisted(files)``.
    """

    def write(self) -> StageWriter:
        """A Spark ML writer: ``stage.write().overwrite().save(path)``."""
        return StageWriter(self)

    @classmethod
    def read(cls) -> StageReader:
        """A Spark ML reader: ``Stage.read().load(path)``."""
        return StageReader(cls)


class StageWriter(MLWriter):
    """Writes a stage's Params metadata plus its Keras model and state files."""

    def __init__(self, instance: Any) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        sc = self.sparkSession.sparkContext
        DefaultParamsWriter.saveMetadata(self.instance, path, sc)
        files = self.instance._persisted_files()
        for key, data in files.items():
            if data is not None:
                write_bytes(sc, f"{path}/{FILES[key]}", data)


class StageReader(MLReader):
    """Reads what :class:`StageWriter` wrote and rebuilds the stage."""

    def __init__(self, cls: Any) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> Any:
        sc = self.sparkSession.sparkContext
        metadata = DefaultParamsReader.loadMetadata(path, sc)
        files: dict[str, bytes | None] = {}
        for key, name in FILES.items():
            full = f"{path}/{name}"
            files[key] = read_bytes(sc, full) if exists(sc, full) else None
        instance = self.cls._from_persisted(files)
        instance._resetUid(metadata["uid"])
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


def _jsonable(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)
