"""The partition cache: spools, CSR rows, the block-wise epoch order, spilling."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from sparkdl.contract.payload import Column
from sparkdl.errors import ConfigError, SchemaError
from sparkdl.executor.blocks import Csr, convert
from sparkdl.executor.cache import PartitionCache, epoch_batches
from sparkdl.executor.spool import Budget, MemorySpool

X, Y, V = Column("x", "dense", 3), Column("y", "int", 1), Column("v", "sparse", 50)


def _vectors(rows: list[tuple[int, list[int], list[float]] | list[float]]) -> pa.Array:
    """ML vectors as Spark sends them: struct<type, size, indices, values>."""
    kinds, sizes, indices, values = [], [], [], []
    for row in rows:
        if isinstance(row, tuple):  # sparse
            kinds.append(0)
            sizes.append(row[0])
            indices.append(row[1])
            values.append(row[2])
        else:  # dense
            kinds.append(1)
            sizes.append(None)
            indices.append(None)
            values.append(row)
    return pa.StructArray.from_arrays(
        [
            pa.array(kinds, pa.int8()),
            pa.array(sizes, pa.int32()),
            pa.array(indices, pa.list_(pa.int32())),
            pa.array(values, pa.list_(pa.float64())),
        ],
        names=["type", "size", "indices", "values"],
    )


def _batch(start: int, rows: int) -> pa.RecordBatch:
    ids = np.arange(start, start + rows)
    return pa.RecordBatch.from_pydict(
        {
            "x": [[float(i), float(i) + 0.5, -float(i)] for i in ids],
            "y": ids.astype(np.int64),
            "v": _vectors([(50, [int(i) % 50], [float(i)]) for i in ids]),
        }
    )


@pytest.fixture(params=["memory", "disk", "auto"])
def cache(request: pytest.FixtureRequest, tmp_path):
    # auto with a tiny budget spills to disk halfway through.
    with PartitionCache([X, Y, V], mode=request.param, budget=2000, directory=str(tmp_path)) as c:
        for start in range(0, 100, 30):
            c.append(_batch(start, min(30, 100 - start)))
        yield c


def test_rows_come_back_as_written(cache: PartitionCache) -> None:
    assert cache.rows == 100
    block = cache.read(10, 40)
    assert block["y"].tolist() == list(range(10, 40))
    np.testing.assert_array_equal(block["x"][:, 0], np.arange(10, 40, dtype=np.float32))
    dense = block["v"].dense()
    assert dense.shape == (30, 50)
    np.testing.assert_array_equal(dense[np.arange(30), np.arange(10, 40) % 50], np.arange(10, 40))
    assert cache.data_bytes == 100 * (3 * 4 + 4) + 101 * 8 + 100 * (4 + 4)


def test_a_memory_cache_grows_past_its_first_map() -> None:
    with PartitionCache([X, Y], mode="memory") as c:
        for start in range(0, 120_000, 20_000):  # 1.9 MB: the map grows from 1 MB
            batch = _batch(start, 20_000)
            c.append(pa.RecordBatch.from_arrays([batch["x"], batch["y"]], names=["x", "y"]))
        arrays = c.arrays()
        assert arrays["y"].tolist() == list(range(120_000))
        np.testing.assert_array_equal(arrays["x"][:, 2], -np.arange(120_000, dtype=np.float32))
        del arrays


def test_auto_spills_to_disk_past_its_budget(tmp_path) -> None:
    with PartitionCache([X, Y], mode="auto", budget=1000, directory=str(tmp_path)) as c:
        c.append(_batch(0, 10))
        assert c.mode == "memory"
        c.append(_batch(10, 100))
        assert c.mode == "disk"
        assert c.read(0, 110)["y"].tolist() == list(range(110))


def test_caches_sharing_a_budget_spill_when_together_they_pass_it(tmp_path) -> None:
    budget = Budget(2500)
    with (
        PartitionCache([X, Y], mode="auto", budget=budget, directory=str(tmp_path)) as train,
        PartitionCache([X, Y], mode="auto", budget=budget, directory=str(tmp_path)) as held,
    ):
        train.append(_batch(0, 60))  # 60 rows x 16 bytes: 960 bytes
        held.append(_batch(0, 60))
        assert (train.mode, held.mode, budget.held) == ("memory", "memory", 1920)
        train.append(_batch(60, 60))  # 2880 together: the cache that passed it spills
        assert (train.mode, held.mode, budget.held) == ("disk", "memory", 960)
        assert train.read(0, 120)["y"].tolist() == list(range(120))


def test_cache_files_have_no_name_and_vanish(tmp_path) -> None:
    open_files = len(os.listdir("/proc/self/fd"))
    with PartitionCache([X, Y], mode="disk", directory=str(tmp_path)) as c:
        c.append(_batch(0, 10))
        assert os.listdir(tmp_path) == []  # unnamed (O_TMPFILE): nothing to clean up
        assert len(os.listdir("/proc/self/fd")) == open_files + 2  # a file a column
    assert len(os.listdir("/proc/self/fd")) == open_files  # closed: the files are gone
    with pytest.raises(RuntimeError, match="memory mode"):
        c.arrays()


def _no_room(self: MemorySpool, nbytes: int) -> None:
    raise OSError(12, "Cannot allocate memory")


def test_a_map_that_cannot_grow_spills_auto_and_stops_memory(tmp_path, monkeypatch) -> None:
    """Under spark.executor.pyspark.memory (a capped address space) a map may not grow."""
    with PartitionCache([X, Y], mode="auto", directory=str(tmp_path)) as auto:
        auto.append(_batch(0, 10))
        monkeypatch.setattr(MemorySpool, "reserve", _no_room)
        auto.append(_batch(10, 10))  # nothing written to memory: all of it to disk
        assert auto.mode == "disk" and auto.budget.held == 0
        assert auto.read(0, 20)["y"].tolist() == list(range(20))
    with PartitionCache([X, Y], mode="memory") as memory:
        with pytest.raises(ConfigError, match="data_cache='disk'"):
            memory.append(_batch(0, 10))
        assert memory.rows == 0 and memory.data_bytes == 0  # left whole


@pytest.mark.parametrize("shuffle", [True, False])
def test_an_epoch_visits_every_row_once_in_full_batches(
    cache: PartitionCache, shuffle: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sparkdl.executor.cache as module

    monkeypatch.setattr(module, "BLOCK_BYTES", 60)  # several blocks and windows
    monkeypatch.setattr(module, "WINDOW_BYTES", 400)
    rng = np.random.default_rng(0)
    orders = []
    for _ in range(2):
        batches = list(epoch_batches(cache, 5, 95, 8, shuffle=shuffle, rng=rng))
        sizes = [len(b["y"]) for b in batches]
        assert sizes == [8] * 11 + [2]
        order = np.concatenate([b["y"] for b in batches])
        assert sorted(order.tolist()) == list(range(5, 95))
        for b in batches:  # the columns stay aligned row by row
            np.testing.assert_array_equal(b["x"][:, 0], b["y"])
            assert b["v"].dense()[np.arange(len(b["y"])), b["y"] % 50].tolist() == b["y"].tolist()
        orders.append(order.tolist())
    if shuffle:
        assert orders[0] != orders[1] and orders[0] != sorted(orders[0])
    else:
        assert orders[0] == orders[1] == list(range(5, 95))


def test_a_limited_epoch_is_a_random_subset(cache: PartitionCache) -> None:
    rng = np.random.default_rng(1)
    rows = np.concatenate(
        [b["y"] for b in epoch_batches(cache, 0, 100, 16, shuffle=True, rng=rng, limit=37)]
    )
    assert len(rows) == 37 and len(set(rows.tolist())) == 37
    assert sorted(rows.tolist()) != list(range(37))  # not the first rows: a random subset


def test_csr_take_concat_and_dense_vectors() -> None:
    block = convert(
        pa.RecordBatch.from_pydict(
            {"v": _vectors([(4, [0, 3], [1.0, 2.0]), [5.0, 0.0, 6.0, 7.0]])}
        ),
        [Column("v", "sparse", 4)],
    )
    csr = block["v"]
    assert isinstance(csr, Csr)
    assert csr.dense().tolist() == [[1, 0, 0, 2], [5, 0, 6, 7]]  # a DenseVector too
    both = Csr.concat([csr, csr.take(np.array([1, 0]))])
    assert both.dense().tolist() == [[1, 0, 0, 2], [5, 0, 6, 7], [5, 0, 6, 7], [1, 0, 0, 2]]
    assert len(both.slice(3, 10)) == 1 and len(both.slice(9, 12)) == 0  # clipped as numpy
    indices, values = both.slice(1, 2).coo()
    assert indices.tolist() == [[0, 0], [0, 1], [0, 2], [0, 3]] and values.tolist() == [5, 0, 6, 7]


def test_rows_of_another_width_are_refused() -> None:
    with pytest.raises(SchemaError, match=r"Expected 3 feature values per row.*rows of 2 values"):
        convert(pa.RecordBatch.from_pydict({"x": [[1.0, 2.0]]}), [X])
    with pytest.raises(SchemaError, match=r"Expected 50 feature values per row.*rows of 60 val"):
        convert(pa.RecordBatch.from_pydict({"v": _vectors([(60, [1], [1.0])])}), [V])
    with pytest.raises(SchemaError, match="index outside"):
        convert(pa.RecordBatch.from_pydict({"v": _vectors([(50, [70], [1.0])])}), [V])
    vectors = _vectors([(50, [1], [1.0]), (50, [2], [2.0])])
    nulled = pa.StructArray.from_arrays(
        vectors.flatten(), fields=list(vectors.type), mask=pa.array([False, True])
    )
    with pytest.raises(SchemaError, match=r"1 row\(s\) with null feature vectors"):
        convert(pa.RecordBatch.from_pydict({"v": nulled}), [V])


def test_dense_vectors_kept_sparse_are_scored_as_csr() -> None:
    """A batch of DenseVectors only (no indices at all) still becomes CSR, as scoring
    reads it."""

    def vectors(types, sizes, indices, values):  # type: ignore[no-untyped-def]
        return pa.RecordBatch.from_pydict(
            {
                "v": pa.StructArray.from_arrays(
                    [
                        pa.array(types, pa.int8()),
                        pa.array(sizes, pa.int32()),
                        pa.array(indices, pa.list_(pa.int32())),
                        pa.array(values, pa.list_(pa.float64())),
                    ],
                    names=["type", "size", "indices", "values"],
                )
            }
        )

    column = Column("v", "sparse", 3)
    dense = vectors([1, 1], [None, None], [None, None], [[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    assert convert(dense, [column])["v"].dense().tolist() == [[1, 0, 2], [0, 3, 0]]
    mixed = vectors([0, 1], [3, None], [[2], None], [[5.0], [0.0, 3.0, 0.0]])
    assert convert(mixed, [column])["v"].dense().tolist() == [[0, 0, 5], [0, 3, 0]]


class _Context:
    """What :func:`sparkdl.driver.cluster.cache_budget` reads of a session: its settings."""

    def __init__(self, conf: dict[str, str]) -> None:
        self.settings = conf

    def conf(self, key: str, default: str | None = None) -> str | None:
        return self.settings.get(key, default)


def test_cache_budget_is_half_of_each_python_workers_share() -> None:
    from sparkdl.driver.cluster import DEFAULT_CACHE_BUDGET, cache_budget

    assert cache_budget(_Context({})) == DEFAULT_CACHE_BUDGET
    # Spark caps each Python worker at pyspark.memory / executor cores.
    conf = {"spark.executor.pyspark.memory": "8g", "spark.executor.cores": "4"}
    assert cache_budget(_Context(conf)) == (8 << 30) // 4 // 2
    assert cache_budget(_Context({"spark.executor.pyspark.memory": "1k"})) == 1 << 20
