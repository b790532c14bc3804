"""Codecs round-trip within their precision, refuse what does not fit, and lose nothing
over time: the worker's error feedback and the service's per-worker copies."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from sparkdl import ConfigError, TrainConfig
from sparkdl.executor.pusher import Pusher
from sparkdl.server.state.errors import StoreError
from sparkdl.server.state.replicas import FULL, Replicas
from sparkdl.sync.codecs import (
    WHOLE,
    BFloat16,
    Codec,
    CodecError,
    Compression,
    Float16,
    Int4,
    Sign,
    TopK,
    follow,
    resolve_compression,
)
from sparkdl.sync.merges import Average, Delta, Elastic, Update
from sparkdl.sync.settings import FitSettings

CODECS: list[Codec] = [Float16(), BFloat16(), TopK(ratio=0.01), Sign(), Int4()]
SPECS = [(np.dtype(np.float32), (40, 30)), (np.dtype(np.float32), (30,)), (np.dtype(np.int64), ())]


def _arrays(seed: int, scale: float = 1.0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        (rng.normal(size=(40, 30)) * scale).astype(np.float32),
        rng.normal(size=30).astype(np.float32),
        np.array(seed, np.int64),
    ]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_small_and_integer_arrays_travel_whole(codec: Codec) -> None:
    """Top-k and sign send arrays of at most DENSE_BELOW values as they are (the casts
    cast every float array); integer arrays always travel as they are."""
    arrays = _arrays(0)
    decoded = codec.decode(codec.encode(arrays), SPECS)
    if codec.name in ("topk", "sign", "int4"):
        np.testing.assert_array_equal(decoded[1], arrays[1])  # 30 <= DENSE_BELOW values
    assert decoded[2] == arrays[2] and decoded[2].dtype == np.int64
    assert decoded[0].dtype == np.float32 and decoded[0].shape == (40, 30)


@pytest.mark.parametrize(("codec", "bits"), [(Float16(), 11), (BFloat16(), 8)])
def test_16_bit_casts_round_trip_within_their_precision(codec: Codec, bits: int) -> None:
    arrays = _arrays(1)
    decoded = codec.decode(codec.encode(arrays), SPECS)
    np.testing.assert_allclose(decoded[0], arrays[0], rtol=2.0**-bits, atol=1e-7)
    assert codec.encode(arrays)[0].itemsize == 2


@pytest.mark.parametrize("scale", [1e-7, 1e-3, 1e6])
def test_fp16_scales_each_array_so_tiny_and_huge_values_keep_their_bits(scale: float) -> None:
    """A step's changes are tiny (float16's subnormals start at 6.1e-5) and a center's
    values may exceed 65504: the per-array power-of-two scale keeps 11 bits of each."""
    arrays = _arrays(6, scale)
    parts = Float16().encode(arrays)
    assert parts[0].dtype == np.float16 and parts[1].dtype == np.float32
    assert np.abs(parts[0]).max() > 32752  # the largest lands in float16's top binade
    decoded = Float16().decode(parts, SPECS)
    np.testing.assert_allclose(decoded[0], arrays[0], rtol=2.0**-11, atol=scale * 1e-6)
    assert np.isfinite(decoded[0]).all()


def test_16_bit_weights_travel_as_they_are() -> None:
    weights = [np.ones(1000, ml_dtypes.bfloat16)]
    parts = Float16().encode(weights)
    assert parts[0].dtype == np.dtype(ml_dtypes.bfloat16)


def test_topk_keeps_the_largest_magnitudes() -> None:
    arrays = _arrays(2)
    codec = TopK(ratio=0.05)
    indices, values = codec.encode(arrays)[:2]
    assert indices.dtype == np.uint32 and indices.size == codec.k(1200) == 60
    flat = arrays[0].reshape(-1)
    assert set(indices.tolist()) == set(np.argsort(-np.abs(flat))[:60].tolist())
    np.testing.assert_array_equal(values, flat[indices])


def test_sign_sends_one_bit_a_value_and_its_signs_mean_magnitudes() -> None:
    x = np.array([2.0, 4.0, -1.0, -3.0] * 100, np.float32)
    bits, scales = Sign().encode([x])
    assert bits.dtype == np.uint8 and bits.size == 50
    np.testing.assert_allclose(scales, [3.0, 2.0])
    decoded = Sign().decode([bits, scales], [(np.dtype(np.float32), (400,))])[0]
    np.testing.assert_allclose(decoded[:4], [3.0, 3.0, -2.0, -2.0])


def _topk_parts() -> list[np.ndarray]:
    return TopK(ratio=0.01).encode(_arrays(3))


BAD_BODIES: list[tuple[str, Codec, Any]] = [
    ("too few arrays", TopK(), lambda p: p[:-1]),
    ("too many arrays", TopK(), lambda p: [*p, p[-1]]),
    ("an index out of range", TopK(), lambda p: [np.array([5, 1200] * 6, np.uint32), *p[1:]]),
    ("an index repeated", TopK(), lambda p: [np.array([5] * 12, np.uint32), *p[1:]]),
    (
        "more values than k",
        TopK(),
        lambda p: [np.arange(13, dtype=np.uint32), np.ones(13, np.float32), *p[2:]],
    ),
    ("indices of another dtype", TopK(), lambda p: [p[0].astype(np.int64), *p[1:]]),
    ("values of another dtype", TopK(), lambda p: [p[0], p[1].astype(np.float64), *p[2:]]),
    ("counts that differ", TopK(), lambda p: [p[0], p[1][:-1], *p[2:]]),
    ("a small array reshaped", TopK(), lambda p: [*p[:2], p[2].reshape(3, 10), p[3]]),
    ("an int array as float", TopK(), lambda p: [*p[:3], np.array(1.0)]),
]


@pytest.mark.parametrize("case", BAD_BODIES, ids=[c[0] for c in BAD_BODIES])
def test_topk_bodies_that_do_not_fit_are_refused(case: tuple[str, Codec, Any]) -> None:
    _, codec, mutate = case
    with pytest.raises(CodecError):
        codec.decode(mutate(_topk_parts()), SPECS)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: [p[0][:-1], *p[1:]],
        lambda p: [p[0], np.array([np.nan, 1.0], np.float32), *p[2:]],
        lambda p: [p[0], np.array([-1.0, 1.0], np.float32), *p[2:]],
        lambda p: [p[0], np.array([np.inf, 1.0], np.float32), *p[2:]],
        lambda p: [p[0], np.ones(3, np.float32), *p[2:]],
    ],
    ids=["short bits", "NaN scale", "negative scale", "inf scale", "three scales"],
)
def test_sign_bodies_that_do_not_fit_are_refused(mutate: Any) -> None:
    with pytest.raises(CodecError):
        Sign().decode(mutate(Sign().encode(_arrays(4))), SPECS)


def test_fp16_bodies_that_do_not_fit_are_refused() -> None:
    parts = Float16().encode(_arrays(5))
    with pytest.raises(CodecError, match="float16"):
        Float16().decode([parts[0].astype(np.float32), *parts[1:]], SPECS)
    for scale in ([np.nan], [0.0], [-1.0], [np.inf], [1.0, 1.0]):
        with pytest.raises(CodecError, match="scale"):
            Float16().decode([parts[0], np.array(scale, np.float32), *parts[2:]], SPECS)


def test_settings_are_checked_on_the_driver() -> None:
    assert TrainConfig(compression="topk", compression_ratio=0.1).compression == "topk"
    with pytest.raises(ConfigError, match="compression"):
        TrainConfig(compression="zip")
    for ratio in (0.0, 0.5, -1, True, "1%"):
        with pytest.raises(ConfigError, match="compression_ratio"):
            TrainConfig(compression="topk", compression_ratio=ratio)


@pytest.mark.parametrize("codec", [TopK(ratio=0.01), Sign(), Float16()], ids=lambda c: c.name)
@pytest.mark.parametrize(
    "merge", [Delta(), Delta(scale=0.5), Average()], ids=["delta", "delta/2", "average"]
)
def test_error_feedback_sends_everything_in_the_end(codec: Codec, merge: Any) -> None:
    """What a push leaves out goes back into the local weights with the answer, so the
    next push carries it: the decoded pushes plus what the weights still hold beyond
    the center add up to every step trained, exactly."""
    pusher = _pusher(codec, merge)
    center = pusher._center  # the answers bring no change: the center stays put
    local = [c.copy() for c in center]
    trained = np.zeros((40, 30))
    received = np.zeros((40, 30))
    for step in range(20):
        progress = _arrays(10 + step)[0]
        local[0] = local[0] + progress
        trained += progress
        update = merge.outgoing(local, center)
        _, decoded = pusher._encode(update, codec)
        received += decoded[0]
        local = pusher._keep_unsent(merge.incoming(local, update, center))
    held = local[0] - center[0]  # what was never sent
    assert np.abs(held).max() > 0  # something was held back
    scale = getattr(merge, "scale", 1.0)
    np.testing.assert_allclose(received + scale * held, scale * trained, atol=1e-3)
    # The fit's closing push goes whole: nothing is held back any more.
    update = merge.outgoing(local, center)
    _, decoded = pusher._encode(update, WHOLE)
    received += decoded[0]
    local = pusher._keep_unsent(merge.incoming(local, update, center))
    np.testing.assert_array_equal(local[0], center[0])
    np.testing.assert_allclose(received, scale * trained, atol=1e-3)


def _pusher(codec: Codec, merge: Any) -> Pusher:
    center = [np.zeros((40, 30), np.float32), np.zeros(30, np.float32), np.array(0)]
    return Pusher(
        None,  # type: ignore[arg-type]
        merge,
        None,  # type: ignore[arg-type]
        center=center,
        version=0,
        overlap=False,
        compression=Compression(codec, codec),
    )


def test_elastic_moves_by_what_the_center_receives_and_keeps_no_residual() -> None:
    pusher = _pusher(TopK(ratio=0.01), Elastic(alpha=0.5))
    _, decoded = pusher._encode(_arrays(7), pusher.codec)
    assert pusher._unsent[0] is None
    assert np.count_nonzero(decoded[0]) == TopK(ratio=0.01).k(1200)


def test_answers_of_topk_keep_every_workers_share() -> None:
    compression = resolve_compression("topk", 0.01, 4)
    assert compression is not None and compression.answer == TopK(ratio=0.04)
    assert resolve_compression("topk", 0.1, 4).answer == TopK(ratio=0.25)  # type: ignore[union-attr]
    assert resolve_compression("sign", 0.01, 4) == Compression(Sign(), Sign())
    assert resolve_compression(None, 0.01, 4) is None


def test_a_service_copy_follows_the_worker_copy_bit_for_bit() -> None:
    codec = TopK(ratio=0.02)
    replicas = Replicas(Compression(codec, codec), Delta(), _arrays(0), newest_attempt=_first)
    center = _arrays(20)
    worker_copy, meta = replicas.answer(0, 0, FULL, center, {"version": 1})
    assert meta["full"]
    for step in range(5):
        center = [
            c + d if c.dtype.kind == "f" else d
            for c, d in zip(center, _arrays(30 + step), strict=True)
        ]
        parts, meta = replicas.answer(0, 0, meta["replica"], center, {})
        assert not meta["full"]
        worker_copy = follow(worker_copy, codec.decode(parts, SPECS))
    replicas.answer(0, 0, meta["replica"], center, {})  # confirms the last copy
    service_copy = replicas._copies[0].base
    assert service_copy is not None
    for a, b in zip(worker_copy, service_copy, strict=True):
        np.testing.assert_array_equal(a, b)
    # What the answers left out is what the copy still lacks: the next answers carry it.
    assert np.abs(center[0] - worker_copy[0]).max() > 0


def _first(worker: int) -> int:
    return 0


def test_copy_numbers_are_checked() -> None:
    attempts = {0: 1}
    replicas = Replicas(
        Compression(Float16(), Float16()),
        Average(relative=True),
        _arrays(0),
        newest_attempt=attempts.get,
    )
    with pytest.raises(StoreError, match="pulls the full weights") as info:
        replicas.unpack(0, 1, 1, Float16().encode(_arrays(1)))  # no full pull yet
    assert info.value.status == 400
    with pytest.raises(StoreError, match="join first"):
        replicas.answer(0, 2, FULL, _arrays(2), {})  # an attempt the store does not know
    _, meta = replicas.answer(0, 1, FULL, _arrays(2), {})
    first = meta["replica"]
    for bad in (first + 1, True, -1, "1", 1.0):
        with pytest.raises(StoreError):
            replicas.unpack(0, 1, bad, Float16().encode(_arrays(1)))
    before = replicas.copy_state()
    pushed = replicas.unpack(0, 1, first, Float16().encode(_arrays(1)))
    assert replicas.copy_state() == before  # a push confirms nothing until answered
    # A merge that pushes weights pushes their difference to the copy, which the
    # (relative) average adds to the center.
    np.testing.assert_allclose(pushed[0], _arrays(1)[0], rtol=1e-3, atol=1e-3)
    # The first answer is lost to a timeout while its retry is answered too: whichever
    # the worker took stays valid, and confirming it drops the other.
    _, slow = replicas.answer(0, 1, first, _arrays(3), {})
    _, retry = replicas.answer(0, 1, first, _arrays(3), {})
    assert replicas.copy_state()["0"] == [1, first, [slow["replica"], retry["replica"]]]
    replicas.answer(0, 1, retry["replica"], _arrays(4), {})
    with pytest.raises(StoreError):
        replicas.answer(0, 1, slow["replica"], _arrays(4), {})  # dropped once one was taken
    attempts[0] = 2  # a retried task joined
    with pytest.raises(StoreError) as info:
        replicas.answer(0, 1, FULL, _arrays(3), {})  # the older attempt
    assert info.value.status == 409
    _, fresh = replicas.answer(0, 2, FULL, _arrays(4), {})  # the retried task starts over
    assert fresh["full"] and replicas.full_answers() == {"0": 2}
    replicas.answer(0, 2, FULL, _arrays(4), {})  # its full pull asked again: still one start
    assert replicas.full_answers() == {"0": 2}
    with pytest.raises(StoreError) as info:
        replicas.unpack(0, 1, retry["replica"], Float16().encode(_arrays(1)))
    assert info.value.status == 409


def test_a_relative_average_averages_differences_onto_the_center() -> None:
    """Under compression an average takes each worker's difference to its copy of the
    center: synchronously their weighted mean is added, asynchronously each moves the
    center by its share, and a lossy answer's undelivered part stays in the center."""
    center = [np.full(3, 10.0, np.float32), np.array([7])]
    ups = [
        Update(worker=0, arrays=[np.array([1.0, 0, 0], np.float32), np.array([8])], samples=1),
        Update(worker=1, arrays=[np.array([0, 3.0, 0], np.float32), np.array([9])], samples=3),
    ]
    merge = Average.resolve(
        FitSettings(TrainConfig(compression="sign").to_dict(), num_workers=2, synchronous=True)
    )
    assert merge.relative and merge.additive
    merged = merge.combine(center, ups)
    np.testing.assert_allclose(merged[0], [10.25, 12.25, 10.0])
    assert merged[1].tolist() == [8]  # integer state travels whole
    stepped = merge.apply(center, ups[1], version=0)
    np.testing.assert_allclose(stepped[0], [10.0, 11.5, 10.0])
    assert not Average.resolve(
        FitSettings(TrainConfig().to_dict(), num_workers=2, synchronous=True)
    ).relative


def test_a_push_with_no_samples_keeps_its_residue_under_a_relative_merge() -> None:
    """Under compression a push with no samples (a padding round, a closing push after
    the epoch's samples were sent) carries what an encoding held back earlier: it
    counts at one worker's share instead of being dropped."""
    center = [np.zeros(2, np.float32)]
    trained = Update(worker=0, arrays=[np.array([4.0, 0], np.float32)], samples=10)
    residue = Update(worker=1, arrays=[np.array([0, 2.0], np.float32)], samples=0)
    for merge in (Average(share=0.5, relative=True), Delta()):
        np.testing.assert_allclose(merge.combine(center, [trained, residue])[0], [4.0, 1.0])
    # Asynchronously the relative average moves the center by its share of it.
    np.testing.assert_allclose(
        Average(share=0.5, relative=True).apply(center, residue, version=0)[0], [0, 1.0]
    )
    # Absolute weights with no samples still weigh nothing.
    np.testing.assert_allclose(Average(share=0.5).apply(center, residue, version=0)[0], [0, 0])


class _Recorder:
    """A pusher that records the ``whole`` flag of every push (no service)."""

    def __init__(self) -> None:
        self.pushes: list[tuple[int, bool]] = []
        self.control: dict[str, Any] = {}

    def push(
        self, samples: int, meta: dict[str, Any], *, wait: bool, whole: bool, index: int = 0
    ) -> bool:
        self.pushes.append((samples, whole))
        return False


def _callback(rows: int, last_epoch: int) -> tuple[Any, _Recorder]:
    from sparkdl.executor.callback import SyncCallback
    from sparkdl.sync.schedule import Schedule

    recorder = _Recorder()
    schedule = Schedule(rows=rows, batch_size=10, frequency=4, rounds=3)
    callback = SyncCallback(recorder, schedule, last_epoch=last_epoch)  # type: ignore[arg-type]
    return callback, recorder


def test_only_the_fits_last_epoch_closes_whole() -> None:
    callback, recorder = _callback(rows=95, last_epoch=3)
    for epoch in range(3):
        callback.on_epoch_begin(epoch)
        callback.on_epoch_end(epoch, {})  # Keras left the epoch early: mid syncs first
    assert [whole for _, whole in recorder.pushes] == [False] * 6 + [True] * 3
    assert recorder.pushes[6] == (95, True)  # the first whole push carries the samples
    # A worker with no rows, outside model.fit (no Keras params), pads and closes too.
    empty, recorder = _callback(rows=0, last_epoch=2)
    for epoch in range(2):
        empty.on_epoch_begin(epoch)
        empty.on_epoch_end(epoch, {})
    assert [whole for _, whole in recorder.pushes] == [False] * 3 + [True, False, False]


def test_int4_keeps_each_value_within_half_a_step_of_its_block() -> None:
    arrays = _arrays(3, scale=50.0)
    parts = Int4().encode(arrays)
    assert parts[0].dtype == np.uint8 and parts[0].size == 600  # 1200 values, 2 a byte
    assert parts[1].dtype == np.float32 and parts[1].size == 19  # ceil(1200 / 64)
    decoded = Int4().decode(parts, SPECS)
    flat = arrays[0].reshape(-1)
    steps = np.repeat(parts[1], 64)[: flat.size]
    assert (np.abs(decoded[0].reshape(-1) - flat) <= steps / 2 + 1e-6 * np.abs(flat)).all()
    assert Int4().encoded_bytes(SPECS[:1]) == 600 + 4 * 19
    # An odd count, zeros, and a block of one value.
    for values in (np.zeros(301, np.float32), np.full(257, -3.5, np.float32)):
        back = Int4().decode(Int4().encode([values]), [(np.dtype(np.float32), values.shape)])
        np.testing.assert_allclose(back[0], values, atol=1e-6)


def test_int4_refuses_parts_that_do_not_fit_and_nan() -> None:
    good = Int4().encode([np.ones(300, np.float32)])
    spec = [(np.dtype(np.float32), (300,))]
    for bad in (
        [good[0][:-1], good[1]],
        [good[0], good[1][:-1]],
        [good[0].astype(np.int8), good[1]],
        [good[0], np.full_like(good[1], np.inf)],
        [good[0], -good[1]],
    ):
        with pytest.raises(CodecError):
            Int4().decode(bad, spec)
    nan = np.ones(300, np.float32)
    nan[5] = np.nan
    with pytest.raises(CodecError, match="finite"):
        Int4().decode(Int4().encode([nan]), spec)
    with pytest.raises(CodecError, match="code is 0"):
        Int4().decode([np.zeros_like(good[0]), good[1]], spec)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64])
def test_int4_takes_every_float_dtype_and_saturates_inf(dtype) -> None:
    values = np.linspace(-3, 3, 300).astype(dtype)
    values[7] = np.inf
    spec = [(np.dtype(dtype), (300,))]
    back = Int4().decode(Int4().encode([values]), spec)[0]
    assert back.dtype == np.dtype(dtype) and np.isfinite(back.astype(np.float64)).all()
