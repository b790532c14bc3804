"""Compressed updates train as uncompressed ones do: every codec in every mode, and with
every merge, on digits against the uncompressed fit in the same test.

One seed per fit (the benchmark, ``benchmarks/compression.py``, takes the mean of 3),
so the bound is loose: a broken codec ends far below it. Real Spark (local[2]),
TensorFlow, and the service over 127.0.0.1; pushes every 4 batches.
"""

from __future__ import annotations

from typing import Any

import pytest

from examples.digits import accuracy, digits_model
from sparkdl import KerasEstimator

# Accuracy sweeps over every codec and merge (20 fits): the --all tier.
pytestmark = [pytest.mark.spark, pytest.mark.slow]

CODECS = ["fp16", "bf16", "topk", "sign", "int4"]
#: Points a one-seed compressed fit may end below the uncompressed one.
SLACK = 0.05


def _fit(train_df: Any, mode: str, merge: str, compression: str | None, epochs: int = 8) -> Any:
    return KerasEstimator(
        model=digits_model(),
        mode=mode,
        merge=merge,
        num_workers=2,
        epochs=epochs,
        batch_size=32,
        frequency=4,
        seed=0,
        compression=compression,
    ).fit(train_df)


def _bytes(fitted: Any) -> tuple[float, float]:
    """Bytes per push the codec encoded (the fit's closing push goes whole) and per
    answer."""
    workers = fitted.fit_report["workers"]
    syncs = sum(w["syncs"] for w in workers)
    whole = sum(w["whole_pushes"] for w in workers)
    return (
        sum(w["push_bytes"] - w["whole_push_bytes"] for w in workers) / (syncs - whole),
        sum(w["answer_bytes"] for w in workers) / syncs,
    )


@pytest.mark.parametrize(
    ("mode", "merge"),
    [("synchronous", "average"), ("asynchronous", "delta"), ("hogwild", "delta")],
)
def test_every_codec_trains_like_uncompressed_updates(digits, mode: str, merge: str) -> None:
    train_df, _, (_, x_test, _, y_test) = digits
    plain = _fit(train_df, mode, merge, None)
    want = accuracy(plain.get_model(), x_test, y_test)
    full_push, full_answer = _bytes(plain)
    for codec in CODECS:
        fitted = _fit(train_df, mode, merge, codec)
        got = accuracy(fitted.get_model(), x_test, y_test)
        assert got >= want - SLACK, (codec, got, want)
        push, answer = _bytes(fitted)
        # digits_model's small arrays (biases) travel whole; the wide ones shrink
        # (int4: 7.1x on them, 5.8x on a whole push with its biases and header).
        shrink = {"fp16": 1.9, "bf16": 1.9, "int4": 5.5}.get(codec, 10)
        assert push * shrink < full_push and answer * shrink < full_answer, (codec, push, answer)
        assert fitted.fit_report["service"]["full_answers"] == {"0": 1, "1": 1}
        # Each worker's closing push went whole: what error feedback held back arrived.
        for worker in fitted.fit_report["workers"]:
            assert worker["whole_pushes"] == 1, worker
            assert worker["whole_push_bytes"] > full_push * 0.9, (worker, full_push)


@pytest.mark.parametrize(
    ("mode", "merge", "codecs"),
    [
        ("synchronous", "delta", ["topk", "sign", "int4"]),
        ("synchronous", "elastic", ["fp16", "topk"]),
        ("asynchronous", "average", ["bf16", "sign"]),
        ("asynchronous", "elastic", ["sign", "topk", "int4"]),
        ("hogwild", "average", ["topk", "fp16"]),
        ("hogwild", "elastic", ["bf16", "sign"]),
    ],
)
def test_the_other_merges_train_compressed(
    digits, mode: str, merge: str, codecs: list[str]
) -> None:
    """Each codec meets each merge (its pushes as differences to the worker's copy for
    average; elastic moving by what the center received)."""
    train_df, _, (_, x_test, _, y_test) = digits
    want = accuracy(_fit(train_df, mode, merge, None, epochs=6).get_model(), x_test, y_test)
    for codec in codecs:
        fitted = _fit(train_df, mode, merge, codec, epochs=6)
        got = accuracy(fitted.get_model(), x_test, y_test)
        assert got >= want - SLACK, (mode, merge, codec, got, want)
