"""Update compression: bytes on the wire, accuracy, and what it buys a wide model.

For ``compression=None`` (full float32 updates), ``"fp16"``, ``"bf16"``, ``"topk"`` (1%
by default) and ``"sign"``, three sections (``--only digits|teacher|wide``; all by
default), 2 workers on ``local[2]``:

* digits (scikit-learn's, the demo's model 64-64-10, Adam, batch 32, 10 epochs, a push
  every ``--frequency`` batches): for synchronous/average and asynchronous/delta, test
  accuracy as the mean (min-max) of ``--seeds`` seeds, and the bytes per push and per
  answer (the workers' ``push_bytes`` and ``answer_bytes`` over their pushes: whole
  HTTP bodies, headers of the wire format included) with how many times fewer than
  uncompressed. Bytes per push count the pushes the codec encoded; each worker's
  closing push of the fit goes whole (what error feedback held back), and "fit's
  pushes x fewer" compares all the bytes a fit pushed, that one included.
* teacher (the synthetic teacher table of ``benchmarks/scale.py``: 100 features, MLP
  100-512-512-10, Adam 1e-3, batch 128, ``--teacher-epochs``, ``--teacher-rows`` rows,
  asynchronous/delta, a push every ``--frequency`` batches): the same figures.
* wide (MLP 100-2048-2048-2048-10, 8.6M parameters, a push every batch, one epoch of
  ``--wide-rows`` teacher rows, one seed, synchronous/average and asynchronous/delta):
  samples/s (rows times epochs over the slowest worker's training loop) and the communication
  share (the workers' seconds in service calls over their training seconds) with and
  without each codec, and the bytes per push and answer.

Every fit of a section runs in the same Spark session, one after another; the machine
is shared and noisy, so compare figures within one run.

Run:
    .venv/bin/python benchmarks/compression.py
    .venv/bin/python benchmarks/compression.py --only digits --seeds 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.scale import accuracy as teacher_accuracy
from benchmarks.scale import build_model, spark_session, teacher_table, test_rows

DIGITS_MODES = [("synchronous", "average"), ("asynchronous", "delta")]


@dataclass
class Figures:
    """One configuration's runs."""

    accuracies: list[float] = field(default_factory=list)
    push_bytes: list[float] = field(default_factory=list)
    answer_bytes: list[float] = field(default_factory=list)
    fit_push_bytes: list[float] = field(default_factory=list)
    samples_per_second: list[float] = field(default_factory=list)
    comm_share: list[float] = field(default_factory=list)

    def add(self, fitted: Any, accuracy: float | None) -> None:
        report = fitted.fit_report
        workers = report["workers"]
        syncs = sum(w["syncs"] for w in workers)
        if accuracy is not None:
            self.accuracies.append(accuracy)
        # Per push encoded with the codec; the closing push that goes whole (what error
        # feedback held back) counts in the bytes of the whole fit.
        whole = sum(w["whole_pushes"] for w in workers)
        pushed = sum(w["push_bytes"] for w in workers)
        self.push_bytes.append(
            (pushed - sum(w["whole_push_bytes"] for w in workers)) / (syncs - whole)
        )
        self.fit_push_bytes.append(pushed)
        self.answer_bytes.append(sum(w["answer_bytes"] for w in workers) / syncs)
        epochs = len(fitted.history["loss"])
        self.samples_per_second.append(report["rows"] * epochs / report["train_seconds"])
        train = sum(w["train_seconds"] for w in workers)
        self.comm_share.append(sum(w["comm_seconds"] for w in workers) / train)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["digits", "teacher", "wide"], action="append")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--codecs",
        nargs="+",
        default=["none", "fp16", "bf16", "topk", "sign"],
        choices=["none", "fp16", "bf16", "topk", "sign"],
    )
    parser.add_argument("--frequency", type=int, default=4)
    parser.add_argument("--ratio", type=float, default=0.01, help="compression_ratio (top-k)")
    parser.add_argument("--teacher-rows", type=int, default=100_000)
    parser.add_argument("--teacher-epochs", type=int, default=3)
    parser.add_argument("--teacher-frequency", type=int, default=16)
    parser.add_argument("--wide-rows", type=int, default=16_384)
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "sparkdl-scale"))
    args = parser.parse_args()
    args.codecs = [None if c == "none" else c for c in args.codecs]
    sections = args.only or ["digits", "teacher", "wide"]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    session = argparse.Namespace(master="local[2]", driver_memory="2g")
    with spark_session(session) as spark:
        if "digits" in sections:
            digits(spark, args)
        if "teacher" in sections:
            teacher(spark, args)
        if "wide" in sections:
            wide(spark, args)


def _fit(frame: Any, model: Any, args: argparse.Namespace, **settings: Any) -> Any:
    """A 2-worker fit of ``model`` with the benchmark's compression ratio."""
    from sparkdl import KerasEstimator

    return KerasEstimator(model=model, num_workers=2, compression_ratio=args.ratio, **settings).fit(
        frame
    )


def digits(spark: Any, args: argparse.Namespace) -> None:
    from examples.digits import accuracy, digits_arrays, digits_frames, digits_model

    train_df, _ = digits_frames(spark, partitions=2)
    train_df = train_df.cache()
    train_df.count()
    _, x_test, _, y_test = digits_arrays()
    print(
        f"\n## digits: 10 epochs, batch 32, a push every {args.frequency} batches, "
        f"{args.seeds} seeds\n"
    )
    for mode, merge in DIGITS_MODES:
        table: dict[str | None, Figures] = {}
        for codec in args.codecs:
            figures = table[codec] = Figures()
            for seed in range(args.seeds):
                fitted = _fit(
                    train_df,
                    digits_model(seed=seed),
                    args,
                    mode=mode,
                    merge=merge,
                    epochs=10,
                    batch_size=32,
                    frequency=args.frequency,
                    seed=seed,
                    compression=codec,
                )
                figures.add(fitted, accuracy(fitted.get_model(), x_test, y_test))
            _log(f"digits {mode}/{merge} {codec}: {figures.accuracies}")
        _print_table(f"{mode}/{merge}", table, speed=False)


def teacher(spark: Any, args: argparse.Namespace) -> None:
    path = teacher_table(args.workdir, args.teacher_rows, 0, 262_144)
    test = test_rows(0, 10_000)
    frame = spark.read.parquet(path)
    print(
        f"\n## teacher: {args.teacher_rows:,} rows, MLP 100-512-512-10, "
        f"{args.teacher_epochs} epochs, batch 128, a push every {args.teacher_frequency} "
        f"batches, {args.seeds} seeds\n"
    )
    table: dict[str | None, Figures] = {}
    for codec in args.codecs:
        figures = table[codec] = Figures()
        for seed in range(args.seeds):
            fitted = _fit(
                frame,
                build_model([512, 512], seed),
                args,
                mode="asynchronous",
                merge="delta",
                epochs=args.teacher_epochs,
                batch_size=128,
                frequency=args.teacher_frequency,
                seed=seed,
                compression=codec,
            )
            figures.add(fitted, teacher_accuracy(fitted.get_model(), test))
        _log(f"teacher {codec}: {figures.accuracies}")
    _print_table("asynchronous/delta", table, speed=True)


def wide(spark: Any, args: argparse.Namespace) -> None:
    path = teacher_table(args.workdir, args.wide_rows, 0, 262_144)
    frame = spark.read.parquet(path)
    params = build_model([2048, 2048, 2048], 0).count_params()
    print(
        f"\n## wide: MLP 100-2048-2048-2048-10 ({params / 1e6:.1f}M parameters), "
        f"{args.wide_rows:,} rows, 1 epoch, batch 128, a push every batch, 1 seed\n"
    )
    for mode, merge in DIGITS_MODES:
        table: dict[str | None, Figures] = {}
        for codec in args.codecs:
            figures = table[codec] = Figures()
            started = time.perf_counter()
            fitted = _fit(
                frame,
                build_model([2048, 2048, 2048], 0),
                args,
                mode=mode,
                merge=merge,
                epochs=1,
                batch_size=128,
                frequency="batch",
                seed=0,
                compression=codec,
            )
            figures.add(fitted, None)
            _log(f"wide {mode} {codec}: {time.perf_counter() - started:.1f} s")
        _print_table(f"{mode}/{merge}", table, speed=True)


def _print_table(title: str, table: dict[str | None, Figures], *, speed: bool) -> None:
    base = table[None]
    full_push = statistics.mean(base.push_bytes)
    full_answer = statistics.mean(base.answer_bytes)
    full_fit = statistics.mean(base.fit_push_bytes)
    base_acc = statistics.mean(base.accuracies) if base.accuracies else None
    columns = ["codec", "bytes/push", "x fewer", "bytes/answer", "x fewer", "fit x fewer"]
    if base.accuracies:
        columns += ["accuracy (min-max)", "vs none (pt)"]
    if speed:
        columns += ["samples/s", "x none", "comm share"]
    print(f"{title}\n")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    base_speed = statistics.mean(base.samples_per_second)
    for codec, figures in table.items():
        push = statistics.mean(figures.push_bytes)
        answer = statistics.mean(figures.answer_bytes)
        cells = [
            codec or "none",
            f"{push:,.0f}",
            f"{full_push / push:.2f}",
            f"{answer:,.0f}",
            f"{full_answer / answer:.1f}",
            f"{full_fit / statistics.mean(figures.fit_push_bytes):.1f}",
        ]
        if figures.accuracies and base_acc is not None:
            acc = figures.accuracies
            cells += [
                f"{statistics.mean(acc):.4f} ({min(acc):.4f}-{max(acc):.4f})",
                f"{100 * (statistics.mean(acc) - base_acc):+.2f}",
            ]
        if speed:
            sps = statistics.mean(figures.samples_per_second)
            cells += [
                f"{sps:,.0f}",
                f"{sps / base_speed:.2f}",
                f"{100 * statistics.mean(figures.comm_share):.1f}%",
            ]
        print("| " + " | ".join(cells) + " |")
    print(flush=True)


def _log(message: str) -> None:
    print(f"# {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
