"""Time to accuracy: plain Keras and every mode x merge, and the SC'17 EASGD comparison.

The teacher workload of ``benchmarks/scale.py`` (100 features, MLP 100-512-512-10,
batch 128, 2 workers on ``local[2]``; 200,000 rows and 3 epochs by default), test
accuracy on 10,000 held-out rows measured after every epoch by a Keras callback (on the
driver for sparkdl, where the driver's model holds the center's weights), against the
wall time since ``fit`` was called and against epochs. The callback's own evaluation
time is taken out of the clock: plain Keras and synchronous fits wait for it (a fit
with driver callbacks holds its rounds at each epoch's end), asynchronous workers train
on meanwhile, which credits them up to that time (about 0.1 s an epoch).

Two parts:

* ``curves``: plain Keras, then every mode x merge with its defaults at ``--frequency``
  (Adam 1e-3, the workload's optimizer). Saves the curves as a PNG (``--png``), their
  figures beside it as JSON (``--replot`` draws the PNG again from it, running no fit), and
  prints each run's final accuracy against plain Keras's (mean of ``--seeds``) and the
  seconds it took to reach ``--target`` of plain Keras's final accuracy.
* ``sc17``: the comparison of You, Buluç and Demmel (SC'17, "Scaling deep learning on
  GPU and knights landing clusters") at ``--sc17-frequency`` (every batch by default,
  as the paper communicates): Async SGD (Downpour: asynchronous delta), Async MSGD (the
  same with momentum 0.9), Hogwild SGD, Async EASGD, Async MEASGD (elastic with
  momentum), Hogwild EASGD and Sync EASGD, with SGD at ``--sgd-rate``. Prints final
  accuracy, seconds to the target (of plain Keras with the same SGD) and the
  communication share: the share of the workers' training time spent in calls to the
  parameter service (the paper's figure).

Run:
    .venv/bin/python benchmarks/convergence.py
    .venv/bin/python benchmarks/convergence.py --part curves --frequency epoch --seeds 3
    .venv/bin/python benchmarks/convergence.py --part curves --frequency batch --seeds 3 \
        --only asynchronous/elastic
    .venv/bin/python benchmarks/convergence.py --part sc17 --rows 100000 --epochs 5
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

from benchmarks.digits import parse_settings
from benchmarks.scale import accuracy, build_model, spark_session, table_arrays, teacher_table
from benchmarks.scale import test_rows as held_out_rows

#: Every mode x merge, in the curves' order.
MODES = ("synchronous", "asynchronous", "hogwild")
MERGES = ("average", "delta", "elastic")

#: The SC'17 methods: name -> (mode, merge, SGD momentum).
SC17: dict[str, tuple[str, str, float]] = {
    "Async SGD": ("asynchronous", "delta", 0.0),
    "Async MSGD": ("asynchronous", "delta", 0.9),
    "Hogwild SGD": ("hogwild", "delta", 0.0),
    "Async EASGD": ("asynchronous", "elastic", 0.0),
    "Async MEASGD": ("asynchronous", "elastic", 0.9),
    "Hogwild EASGD": ("hogwild", "elastic", 0.0),
    "Sync EASGD": ("synchronous", "elastic", 0.0),
}


@dataclass
class Curve:
    """One fit's test accuracy after each epoch, against seconds since the fit began."""

    name: str
    seconds: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    communication_share: float | None = None

    @property
    def final(self) -> float:
        return self.accuracy[-1]

    def seconds_to(self, target: float) -> float | None:
        """Seconds until the first epoch whose accuracy reached ``target``."""
        for seconds, acc in zip(self.seconds, self.accuracy, strict=True):
            if acc >= target:
                return seconds
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["curves", "sc17", "both"], default="both")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--frequency", default="16", help="the curves' frequency")
    parser.add_argument("--sc17-frequency", default="batch")
    parser.add_argument("--sgd-rate", type=float, default=0.01)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument(
        "--target", type=float, default=0.98, help="share of plain Keras's final accuracy"
    )
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="estimator settings for every sparkdl run (e.g. lr_scaling=linear)",
    )
    parser.add_argument(
        "--only", nargs="*", default=None, help="mode/merge rows of the curves (no PNG then)"
    )
    parser.add_argument("--png", default=os.path.join("benchmarks", "convergence.png"))
    parser.add_argument(
        "--replot", default=None, help="plot the curves of a saved JSON again, running no fit"
    )
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "sparkdl-scale"))
    args = parser.parse_args()
    if args.replot:
        with open(args.replot, encoding="utf-8") as f:
            plot_curves(json.load(f), args.png)
        return
    fixed = {"mode", "merge", "frequency", "num_workers", "epochs", "batch_size", "seed"}
    args.settings = parse_settings(parser, args.set, fixed | {"callbacks"})
    names = [f"{mode}/{merge}" for mode in MODES for merge in MERGES]
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            parser.error(f"--only takes mode/merge names among {names}; received {unknown}")
        names = [n for n in names if n in args.only]
    path = teacher_table(args.workdir, args.rows, 0, 262_144)
    test = held_out_rows(0, 10_000)
    x, y = table_arrays(path, args.rows)
    curves_part = args.part in ("curves", "both")
    sc17_part = args.part in ("sc17", "both")
    plain: dict[str, list[Curve]] = {}
    for seed in range(args.seeds):
        if curves_part:
            plain.setdefault("adam", []).append(_keras(x, y, args, test, seed, "adam"))
        if sc17_part:
            for momentum in (0.0, 0.9):
                curve = _keras(x, y, args, test, seed, _sgd(args.sgd_rate, momentum))
                plain.setdefault(f"sgd{momentum}", []).append(curve)
    del x, y
    distributed: dict[str, list[Curve]] = {}
    session = argparse.Namespace(master=f"local[{args.workers}]", driver_memory="2g")
    with spark_session(session) as spark:
        frame = spark.read.parquet(path)
        frame.count()
        for seed in range(args.seeds):
            if curves_part:
                for name in names:
                    run = _sparkdl(frame, args, test, seed, name, "adam", args.frequency)
                    distributed.setdefault(name, []).append(run)
            if sc17_part:
                for name, (mode, merge, momentum) in SC17.items():
                    run = _sparkdl(
                        frame,
                        args,
                        test,
                        seed,
                        f"{mode}/{merge}",
                        _sgd(args.sgd_rate, momentum),
                        args.sc17_frequency,
                    )
                    distributed.setdefault(name, []).append(run)
    if curves_part:
        _print_curves(args, plain["adam"], {n: distributed[n] for n in names})
        if not args.only:
            _plot(args, plain["adam"], {n: distributed[n] for n in names})
    if sc17_part:
        _print_sc17(args, plain, {n: distributed[n] for n in SC17})


# ---------------------------------------------------------------- the runs


def _sgd(rate: float, momentum: float) -> str:
    return f"sgd:{rate}:{momentum}"


def _model(seed: int, optimizer: str) -> Any:
    import keras

    model = build_model([512, 512], seed)
    if optimizer != "adam":
        _, rate, momentum = optimizer.split(":")
        model.compile(
            optimizer=keras.optimizers.SGD(float(rate), momentum=float(momentum)),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
    return model


def _recorder(curve: Curve, test: Any, started: float) -> Any:
    """A Keras callback that appends test accuracy and seconds since ``started`` (its
    own evaluation time left out) to ``curve`` after every epoch."""
    import keras

    class AccuracyClock(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.spent = 0.0

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            now = time.perf_counter()
            curve.seconds.append(now - started - self.spent)
            curve.accuracy.append(accuracy(self.model, test))
            self.spent += time.perf_counter() - now

    return AccuracyClock()


def _keras(x: Any, y: Any, args: argparse.Namespace, test: Any, seed: int, opt: str) -> Curve:
    model = _model(seed, opt)
    curve = Curve("plain Keras")
    started = time.perf_counter()
    model.fit(
        x,
        y,
        epochs=args.epochs,
        batch_size=args.batch_size,
        verbose=0,
        callbacks=[_recorder(curve, test, started)],
    )
    _log(f"plain Keras {opt} seed {seed}: {curve.final:.4f} in {curve.seconds[-1]:.1f} s")
    return curve


def _sparkdl(
    frame: Any,
    args: argparse.Namespace,
    test: Any,
    seed: int,
    name: str,
    optimizer: str,
    frequency: str,
) -> Curve:
    from sparkdl import KerasEstimator

    mode, merge = name.split("/")
    curve = Curve(name)
    started = time.perf_counter()
    fitted = KerasEstimator(
        model=_model(seed, optimizer),
        num_workers=args.workers,
        mode=mode,
        merge=merge,
        frequency=int(frequency) if frequency.isdigit() else frequency,
        epochs=args.epochs,
        batch_size=args.batch_size,
        seed=seed,
        callbacks=[_recorder(curve, test, started)],
        **args.settings,
    ).fit(frame)
    curve.communication_share = fitted.fit_report["communication_share"]
    _log(f"{name} {optimizer} seed {seed}: {curve.final:.4f} in {curve.seconds[-1]:.1f} s")
    return curve


# ---------------------------------------------------------------- the figures


def _mean_curve(curves: list[Curve]) -> Curve:
    """The mean over seeds of each epoch's seconds and accuracy."""
    epochs = min(len(c.accuracy) for c in curves)
    shares = [c.communication_share for c in curves if c.communication_share is not None]
    return Curve(
        curves[0].name,
        [statistics.mean(c.seconds[e] for c in curves) for e in range(epochs)],
        [statistics.mean(c.accuracy[e] for c in curves) for e in range(epochs)],
        statistics.mean(shares) if shares else None,
    )


def _row(name: str, curves: list[Curve], base: Curve, target: float) -> str:
    mean = _mean_curve(curves)
    finals = [c.final for c in curves]
    spread = f" ({min(finals):.4f}-{max(finals):.4f})" if len(finals) > 1 else ""
    reach = mean.seconds_to(target)
    share = "" if mean.communication_share is None else f"{mean.communication_share:.1%}"
    return (
        f"| {name} | {mean.final:.4f}{spread} | {100 * (mean.final - base.final):+.2f} | "
        f"{mean.seconds[-1]:.1f} | {'not reached' if reach is None else f'{reach:.1f}'} | "
        f"{share} |"
    )


def _header(target_share: float, target: float) -> None:
    print(
        "| run | final test acc (range) | vs plain Keras, pt | fit s | "
        f"s to {target_share:.0%} of plain Keras ({target:.4f}) | communication share |"
    )
    print("|---|---:|---:|---:|---:|---:|")


def _print_curves(
    args: argparse.Namespace, plain: list[Curve], runs: dict[str, list[Curve]]
) -> None:
    base = _mean_curve(plain)
    target = args.target * base.final
    print(
        f"\n## Curves: teacher {args.rows:,} rows, MLP 100-512-512-10, Adam 1e-3, "
        f"{args.epochs} epochs, batch {args.batch_size}, {args.workers} workers, "
        f"frequency={args.frequency}, mean of {args.seeds} seed(s), "
        f"settings {args.settings}\n"
    )
    _header(args.target, target)
    print(_row("plain Keras (1 process)", plain, base, target))
    for name, curves in runs.items():
        print(_row(name, curves, base, target))


def _print_sc17(
    args: argparse.Namespace, plain: dict[str, list[Curve]], runs: dict[str, list[Curve]]
) -> None:
    print(
        f"\n## SC'17 methods: teacher {args.rows:,} rows, SGD {args.sgd_rate} (momentum 0.9 "
        f"for the M rows), {args.epochs} epochs, batch {args.batch_size}, {args.workers} "
        f"workers, frequency={args.sc17_frequency}, mean of {args.seeds} seed(s)\n"
    )
    base = _mean_curve(plain["sgd0.0"])
    momentum_base = _mean_curve(plain["sgd0.9"])
    target = args.target * base.final
    _header(args.target, target)
    print(_row("plain Keras, SGD (1 process)", plain["sgd0.0"], base, target))
    print(_row("plain Keras, momentum SGD", plain["sgd0.9"], momentum_base, target))
    for name, curves in runs.items():
        momentum = SC17[name][2]
        print(_row(name, curves, momentum_base if momentum else base, target))
    print(
        "\n(M rows are compared with plain Keras with momentum; seconds to the target "
        "use plain SGD's final accuracy for every row.)"
    )


def _plot(args: argparse.Namespace, plain: list[Curve], runs: dict[str, list[Curve]]) -> None:
    """Saves the mean curves as JSON next to the PNG (``--replot`` reads it), then plots."""
    title = (
        f"Teacher {args.rows:,} rows, Adam 1e-3, batch {args.batch_size},\n{args.workers} "
        f"workers, frequency={args.frequency}, mean of {args.seeds} seed(s)"
    )
    data: dict[str, Any] = {"title": title, "curves": {}}
    for name, curves in [("plain Keras", plain), *runs.items()]:
        mean = _mean_curve(curves)
        data["curves"][name] = {"seconds": mean.seconds, "accuracy": mean.accuracy}
    path = os.path.splitext(args.png)[0] + ".json"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    print(f"\nCurves' figures saved to {path}")
    plot_curves(data, args.png)


def plot_curves(data: dict[str, Any], png: str) -> None:
    """Test accuracy against wall seconds (top) and epochs (bottom), one line per run:
    colour the merge, line style the mode, a legend below; read at about 800 px wide."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    plt.rcParams.update({"font.size": 12})
    figure, (by_time, by_epoch) = plt.subplots(2, 1, figsize=(8, 10), sharey=True)
    styles = {"synchronous": "-", "asynchronous": "--", "hogwild": ":"}
    colors = {"average": "tab:blue", "delta": "tab:orange", "elastic": "tab:green"}
    for name, curve in data["curves"].items():
        mode, _, merge = name.partition("/")
        style, color = (styles[mode], colors[merge]) if merge else ("-", "black")
        width = 2.5 if not merge else 1.6
        epochs = list(range(1, len(curve["accuracy"]) + 1))
        for axis, xs in ((by_time, curve["seconds"]), (by_epoch, epochs)):
            axis.plot(
                xs,
                curve["accuracy"],
                style,
                color=color,
                marker="o",
                markersize=4,
                linewidth=width,
                label=name,
            )
    by_epoch.xaxis.set_major_locator(MaxNLocator(integer=True))
    by_time.set_xlabel("wall seconds since fit() began")
    by_epoch.set_xlabel("epoch")
    for axis in (by_time, by_epoch):
        axis.set_ylabel("test accuracy")
        axis.grid(True, alpha=0.3)
    handles, labels = by_epoch.get_legend_handles_labels()
    figure.legend(
        handles,
        labels,
        loc="lower center",
        ncol=3,
        fontsize=10.5,
        frameon=False,
        title="mode/merge (colour: merge; line: mode)",
    )
    figure.suptitle(data["title"], fontsize=12)
    figure.tight_layout(rect=(0, 0.13, 1, 1))
    figure.savefig(png, dpi=100)
    plt.close(figure)
    print(f"Curves saved to {png}")


def _log(message: str) -> None:
    print(f"# {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
