"""Communicating less: accuracy against the bytes a fit pushes, SC'17-style.

Synchronous fits of 8 workers (``--workers``) with inner Adam, on two workloads:

* **teacher**: the synthetic teacher table of ``benchmarks/scale.py`` (200k rows, 100
  features, 10 classes; MLP 100-512-512-10, Adam 1e-3), ``--teacher-epochs`` epochs of
  batches of ``--teacher-batch``: 390 batches a worker an epoch at the defaults;
* **digits**: scikit-learn's digits (the demo's 64-64-10 model, Adam 0.003),
  ``--digits-epochs`` epochs of batches of ``--digits-batch`` (22 batches a worker an
  epoch at the defaults: every epoch ends with a sync, so no setting pushes less than
  once an epoch).

Configurations (``--configs`` picks some by name):

* ``every batch``: ``frequency=1``, today's most communicating fit: the baseline;
* ``plain H``: model averaging every H = 16, 64, 256 batches (local SGD);
* ``SlowMo H``: the same with ``outer_optimizer="sgd"``, ``outer_learning_rate=1``,
  ``outer_momentum=0.7`` (Wang et al. 2020);
* ``DiLoCo H``: ``outer_optimizer="nesterov"`` with its defaults (0.7, 0.9; Douillard
  et al. 2023);
* ``DiLoCo H, 4 fragments``: ``sync_fragments=4`` (Streaming DiLoCo): each sync pushes
  a quarter of the weights, every fragment every 4 H batches;
* ``DiLoCo H, int4``, ``DiLoCo H, 4 fragments, int4``: with 4-bit updates
  (``compression="int4"``).

For each: the test accuracy's mean (min-max) over ``--seeds`` seeds, the bytes the
workers pushed in all (``push_bytes``: whole request bodies), how many times fewer than
``every batch``, and the fit's seconds. A PNG (``--png``) plots accuracy against bytes
pushed, log scale, one panel per workload, and saves the plotted figures beside it as
JSON (``docs/benchmarks/communication.json``); ``--replot`` draws the PNG again from that
JSON without running a fit.

Run (about 25 minutes on 2 cores):
    .venv/bin/python benchmarks/communication.py --png docs/benchmarks/communication.png
    .venv/bin/python benchmarks/communication.py --replot docs/benchmarks/communication.json
    .venv/bin/python benchmarks/communication.py --only digits --seeds 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.scale import accuracy as teacher_accuracy
from benchmarks.scale import build_model, spark_session, teacher_table, test_rows

SLOWMO = {"outer_optimizer": "sgd", "outer_learning_rate": 1.0, "outer_momentum": 0.7}
DILOCO = {"outer_optimizer": "nesterov"}


def configurations() -> list[tuple[str, int, dict[str, Any]]]:
    """``(name, frequency, settings)`` of every configuration, the baseline first."""
    found: list[tuple[str, int, dict[str, Any]]] = [("every batch", 1, {})]
    for every in (16, 64, 256):
        found.append((f"plain {every}", every, {}))
        found.append((f"SlowMo {every}", every, SLOWMO))
        found.append((f"DiLoCo {every}", every, DILOCO))
    found += [
        ("DiLoCo 64, 4 fragments", 64, {**DILOCO, "sync_fragments": 4}),
        ("DiLoCo 64, int4", 64, {**DILOCO, "compression": "int4"}),
        (
            "DiLoCo 64, 4 fragments, int4",
            64,
            {**DILOCO, "sync_fragments": 4, "compression": "int4"},
        ),
        (
            "DiLoCo 256, 4 fragments, int4",
            256,
            {**DILOCO, "sync_fragments": 4, "compression": "int4"},
        ),
    ]
    return found


@dataclass
class Figures:
    """One configuration's runs."""

    accuracies: list[float] = field(default_factory=list)
    pushed: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["teacher", "digits"], action="append")
    parser.add_argument("--configs", nargs="*", default=None, help="configuration names")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--teacher-rows", type=int, default=200_000)
    parser.add_argument("--teacher-epochs", type=int, default=2)
    parser.add_argument("--teacher-batch", type=int, default=64)
    parser.add_argument("--digits-epochs", type=int, default=20)
    parser.add_argument("--digits-batch", type=int, default=8)
    parser.add_argument("--png", default=None, help="write the plot here (its data beside it)")
    parser.add_argument(
        "--replot", default=None, help="plot a saved JSON of figures again, running no fit"
    )
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "sparkdl-scale"))
    args = parser.parse_args()
    if args.replot:
        with open(args.replot, encoding="utf-8") as f:
            plot(json.load(f), args.png or os.path.splitext(args.replot)[0] + ".png")
        return
    chosen = [c for c in configurations() if args.configs is None or c[0] in args.configs]
    sections = args.only or ["teacher", "digits"]
    session = argparse.Namespace(master=f"local[{args.workers}]", driver_memory="3g", connect=False)
    results: dict[str, dict[str, Figures]] = {}
    with spark_session(session) as spark:
        for section in sections:
            run = teacher if section == "teacher" else digits
            results[section] = run(spark, args, chosen)
    if args.png:
        data = summary(results)
        print(f"wrote {save_summary(data, args.png)}")
        plot(data, args.png)


def teacher(
    spark: Any, args: argparse.Namespace, chosen: list[tuple[str, int, dict[str, Any]]]
) -> dict[str, Figures]:
    path = teacher_table(args.workdir, args.teacher_rows, 0, 262_144)
    test = test_rows(0, 10_000)
    frame = spark.read.parquet(path)
    batches = args.teacher_rows // args.workers // args.teacher_batch
    print(
        f"\n## teacher: {args.teacher_rows:,} rows, MLP 100-512-512-10, Adam 1e-3, "
        f"{args.workers} workers, {args.teacher_epochs} epochs, batch {args.teacher_batch} "
        f"(about {batches} batches a worker an epoch), {args.seeds} seeds\n",
        flush=True,
    )
    table: dict[str, Figures] = {}
    for name, every, settings in chosen:
        figures = table[name] = Figures()
        for seed in range(args.seeds):
            fitted = _fit(
                frame,
                build_model([512, 512], seed),
                args,
                epochs=args.teacher_epochs,
                batch_size=args.teacher_batch,
                frequency=every,
                seed=seed,
                features_col="features",
                label_col="label",
                **settings,
            )
            _add(figures, fitted, teacher_accuracy(fitted.get_model(), test))
        _log(f"teacher {name}: {figures.accuracies}")
    _print_table(table)
    return table


def digits(
    spark: Any, args: argparse.Namespace, chosen: list[tuple[str, int, dict[str, Any]]]
) -> dict[str, Figures]:
    from examples.digits import accuracy, digits_arrays, digits_frames, digits_model

    train_df, _ = digits_frames(spark, partitions=args.workers)
    train_df = train_df.cache()
    train_df.count()
    _, x_test, _, y_test = digits_arrays()
    print(
        f"\n## digits: 1,437 rows, MLP 64-64-10, Adam 0.003, {args.workers} workers, "
        f"{args.digits_epochs} epochs, batch {args.digits_batch}, {args.seeds} seeds\n",
        flush=True,
    )
    table: dict[str, Figures] = {}
    for name, every, settings in chosen:
        figures = table[name] = Figures()
        for seed in range(args.seeds):
            fitted = _fit(
                train_df,
                digits_model(seed=seed),
                args,
                epochs=args.digits_epochs,
                batch_size=args.digits_batch,
                frequency=every,
                seed=seed,
                **settings,
            )
            _add(figures, fitted, accuracy(fitted.get_model(), x_test, y_test))
        _log(f"digits {name}: {figures.accuracies}")
    train_df.unpersist()
    _print_table(table)
    return table


def summary(results: dict[str, dict[str, Figures]]) -> dict[str, dict[str, dict[str, float]]]:
    """Each workload's configurations as the figures the table and the plot show."""
    return {
        section: {
            name: {
                "pushed_bytes": statistics.mean(figures.pushed),
                "accuracy_mean": statistics.mean(figures.accuracies),
                "accuracy_min": min(figures.accuracies),
                "accuracy_max": max(figures.accuracies),
                "fit_seconds": statistics.median(figures.seconds),
            }
            for name, figures in table.items()
        }
        for section, table in results.items()
    }


def save_summary(data: dict[str, dict[str, dict[str, float]]], png: str) -> str:
    """Writes the plotted figures as JSON next to the PNG (``--replot`` reads them)."""
    path = os.path.splitext(png)[0] + ".json"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    return path


#: Colour by method, marker by sync interval: a legend for each, no labels on the points.
_COLOURS = {
    "every batch": "black",
    "plain": "tab:gray",
    "SlowMo": "tab:blue",
    "DiLoCo": "tab:red",
    "DiLoCo, 4 fragments": "tab:purple",
    "DiLoCo, int4": "tab:orange",
    "DiLoCo, 4 fragments, int4": "tab:green",
}
_MARKERS = {"1": "*", "16": "o", "64": "s", "256": "^"}


def _method_and_interval(name: str) -> tuple[str, str]:
    """``"DiLoCo 64, 4 fragments"`` -> ``("DiLoCo, 4 fragments", "64")``."""
    if name == "every batch":
        return name, "1"
    head, _, tail = name.partition(",")
    family, interval = head.split()
    return (family + ("," + tail if tail else "")), interval


def plot(data: dict[str, dict[str, dict[str, float]]], path: str) -> None:
    """Accuracy against bytes pushed (log scale), one panel per workload, stacked, with
    legends for the method (colour) and the sync interval (marker); sized to be read at
    about 800 pixels wide."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    plt.rcParams.update({"font.size": 12})
    fig, axes = plt.subplots(len(data), 1, figsize=(8, 4.6 * len(data) + 1.2), squeeze=False)
    for ax, (section, table) in zip(axes[:, 0], data.items(), strict=True):
        placed: list[tuple[float, float]] = []
        for name, row in table.items():
            method, interval = _method_and_interval(name)
            mean, pushed = row["accuracy_mean"], row["pushed_bytes"]
            # Configurations with the same bytes and accuracy (digits syncs once an epoch
            # from 64 batches on) would hide each other: spread them sideways a little.
            same = sum(abs(pushed / x - 1) < 0.05 and abs(mean - y) < 5e-4 for x, y in placed)
            placed.append((pushed, mean))
            ax.errorbar(
                pushed * 1.09**same,
                mean,
                yerr=[[mean - row["accuracy_min"]], [row["accuracy_max"] - mean]],
                color=_COLOURS.get(method, "tab:brown"),
                marker=_MARKERS.get(interval, "D"),
                markersize=8,
                capsize=3,
                linewidth=1.2,
                alpha=0.9,
            )
        ax.set_xscale("log")
        ax.set_xlabel("bytes pushed by all workers in the fit (log scale)")
        ax.set_ylabel("test accuracy")
        ax.set_title(f"{section}: mean, bars min-max over seeds", fontsize=13)
        ax.grid(True, which="both", alpha=0.3)
    methods = [
        m
        for m in _COLOURS
        if any(_method_and_interval(n)[0] == m for t in data.values() for n in t)
    ]
    colour_handles = [
        Line2D([], [], color=_COLOURS[m], marker="o", linestyle="", markersize=8, label=m)
        for m in methods
    ]
    marker_handles = [
        Line2D(
            [],
            [],
            color="black",
            marker=mk,
            linestyle="",
            markersize=8,
            label="every batch" if k == "1" else f"sync every {k} batches",
        )
        for k, mk in _MARKERS.items()
    ]
    fig.legend(
        handles=colour_handles,
        loc="lower left",
        ncol=2,
        fontsize=10.5,
        title="method",
        frameon=False,
        bbox_to_anchor=(0.02, 0.0),
    )
    fig.legend(
        handles=marker_handles,
        loc="lower right",
        ncol=1,
        fontsize=10.5,
        title="sync interval",
        frameon=False,
        bbox_to_anchor=(0.98, 0.0),
    )
    fig.tight_layout(rect=(0, 0.14 if len(data) > 1 else 0.3, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"\nwrote {path}")


# ------------------------------------------------------------------ helpers
def _fit(frame: Any, model: Any, args: argparse.Namespace, **settings: Any) -> Any:
    from sparkdl import KerasEstimator

    return KerasEstimator(
        model=model, num_workers=args.workers, mode="synchronous", merge="average", **settings
    ).fit(frame)


def _add(figures: Figures, fitted: Any, accuracy: float) -> None:
    report = fitted.fit_report
    figures.accuracies.append(accuracy)
    figures.pushed.append(float(sum(w["push_bytes"] for w in report["workers"])))
    figures.seconds.append(float(report["seconds"]))


def _print_table(table: dict[str, Figures]) -> None:
    base_name, base = next(iter(table.items()))
    base_bytes = statistics.mean(base.pushed)
    base_acc = statistics.mean(base.accuracies)
    print(
        f"| configuration | MB pushed | x fewer | accuracy, mean (min-max) | vs {base_name}, "
        "pt | fit s |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, figures in table.items():
        pushed = statistics.mean(figures.pushed)
        mean = statistics.mean(figures.accuracies)
        spread = f" ({min(figures.accuracies):.4f}-{max(figures.accuracies):.4f})"
        print(
            f"| {name} | {pushed / 1e6:,.1f} | {_times(base_bytes / pushed)} | {mean:.4f}{spread} "
            f"| {100 * (mean - base_acc):+.2f} | {statistics.median(figures.seconds):.1f} |",
            flush=True,
        )


def _times(ratio: float) -> str:
    return f"{ratio:,.0f}" if ratio >= 10 else f"{ratio:.1f}"


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
