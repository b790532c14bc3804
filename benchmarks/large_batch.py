"""The large-batch recipe: 8 synchronous workers against one process, with and without it.

Synchronous training over n workers multiplies the global batch by n: with the model's
learning rate unchanged, each epoch takes 1/n as many steps of the center and the fit
falls behind a single process after the same epochs. The recipe (``lr_scaling``,
``warmup_epochs``, layer-wise optimizers; :mod:`sparkdl.sync.recipe`) closes the gap.

The teacher workload of ``benchmarks/scale.py`` (100 features, MLP 100-512-512-10,
batch 128 per worker, ``--epochs``, ``--optimizer sgd`` (SGD 0.01, where the global
batch costs most; LARS for the layer-wise run) or ``adam`` (Adam 1e-3; LAMB)), test
accuracy on 10,000 held-out rows, the mean
(min-max) over ``--seeds`` seeds: plain Keras in this process at batch 128 (what one
worker reaches), then ``--workers`` workers (``local[N]``: on a 2-core machine they take
turns, which changes speed, not accuracy) in synchronous averaging at
``--frequency``, without the recipe and with each recipe.

Run:
    .venv/bin/python benchmarks/large_batch.py
    .venv/bin/python benchmarks/large_batch.py --optimizer adam --seeds 1
    .venv/bin/python benchmarks/large_batch.py --optimizer adam --only "LAMB(1e-3)"
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.scale import accuracy, build_model, spark_session, table_arrays, teacher_table
from benchmarks.scale import test_rows as held_out_rows

#: Per ``--optimizer``: the single-process optimizer, then name -> (estimator
#: settings, optimizer) for each distributed run.
RECIPES: dict[str, dict[str, tuple[dict[str, Any], str]]] = {
    "sgd": {
        "no recipe": ({"lr_scaling": None}, "sgd"),
        "lr_scaling=linear": ({"lr_scaling": "linear"}, "sgd"),
        "lr_scaling=linear, warmup_epochs=0.25": (
            {"lr_scaling": "linear", "warmup_epochs": 0.25},
            "sgd",
        ),
        "LARS(1.0, momentum=0.9)": ({"lr_scaling": None}, "lars"),
    },
    "adam": {
        "no recipe": ({"lr_scaling": None}, "adam"),
        "lr_scaling=sqrt, warmup_epochs=0.25": (
            {"lr_scaling": "sqrt", "warmup_epochs": 0.25},
            "adam",
        ),
        "LAMB(1e-3)": ({"lr_scaling": None}, "lamb"),
        "LAMB(1e-3), lr_scaling=sqrt, warmup_epochs=0.25": (
            {"lr_scaling": "sqrt", "warmup_epochs": 0.25},
            "lamb",
        ),
    },
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--frequency", default="batch")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--optimizer", choices=list(RECIPES), default="sgd")
    parser.add_argument("--only", nargs="*", default=None, help="names of the runs to do")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "sparkdl-scale"))
    args = parser.parse_args()
    recipes = RECIPES[args.optimizer]
    if args.only:
        unknown = sorted(set(args.only) - set(recipes))
        if unknown:
            parser.error(f"--only takes run names among {list(recipes)}; received {unknown}")
        recipes = {name: recipes[name] for name in args.only}
    frequency = int(args.frequency) if args.frequency.isdigit() else args.frequency
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    path = teacher_table(args.workdir, args.rows, 0, 262_144)
    test = held_out_rows(0, 10_000)
    results: dict[str, list[float]] = {"plain Keras, 1 process": []}
    seconds: dict[str, list[float]] = {"plain Keras, 1 process": []}
    x, y = table_arrays(path, args.rows)
    for seed in range(args.seeds):
        model = _model(seed, args.optimizer)
        started = time.perf_counter()
        model.fit(x, y, epochs=args.epochs, batch_size=args.batch_size, verbose=0)
        seconds["plain Keras, 1 process"].append(time.perf_counter() - started)
        results["plain Keras, 1 process"].append(accuracy(model, test))
        _log(f"plain Keras seed {seed}: {results['plain Keras, 1 process'][-1]:.4f}")
    del x, y
    session = argparse.Namespace(master=f"local[{args.workers}]", driver_memory="2g")
    with spark_session(session) as spark:
        from sparkdl import KerasEstimator

        frame = spark.read.parquet(path)
        for name, (settings, optimizer) in recipes.items():
            results[name], seconds[name] = [], []
            for seed in range(args.seeds):
                started = time.perf_counter()
                fitted = KerasEstimator(
                    model=_model(seed, optimizer),
                    num_workers=args.workers,
                    mode="synchronous",
                    merge="average",
                    frequency=frequency,
                    epochs=args.epochs,
                    batch_size=args.batch_size,
                    seed=seed,
                    **settings,
                ).fit(frame)
                seconds[name].append(time.perf_counter() - started)
                results[name].append(accuracy(fitted.get_model(), test))
                _log(f"{name} seed {seed}: {results[name][-1]:.4f}")
    base = statistics.mean(results["plain Keras, 1 process"])
    print(
        f"\n## teacher: {args.rows:,} rows, MLP 100-512-512-10, {args.optimizer} "
        f"({OPTIMIZERS[args.optimizer]}), {args.epochs} epochs, batch {args.batch_size}; "
        f"{args.workers} synchronous workers (average, frequency={args.frequency}: global "
        f"batch {args.workers * args.batch_size}), "
        f"{args.seeds} seeds\n"
    )
    print("| run | test accuracy (min-max) | vs 1 process (pt) | fit s |")
    print("|---|---|---:|---:|")
    for name, accs in results.items():
        label = name if name.startswith("plain") else f"{args.workers} workers, {name}"
        mean, fit = statistics.mean(accs), statistics.median(seconds[name])
        print(
            f"| {label} | {mean:.4f} ({min(accs):.4f}-{max(accs):.4f}) | "
            f"{100 * (mean - base):+.2f} | {fit:.1f} |"
        )


#: What each optimizer name compiles with.
OPTIMIZERS = {
    "sgd": "SGD(0.01)",
    "adam": "Adam(1e-3)",
    "lars": "LARS(1.0, momentum=0.9)",
    "lamb": "Lamb(1e-3)",
}


def _model(seed: int, optimizer: str) -> Any:
    import keras

    from sparkdl.optimizers import LARS

    model = build_model([512, 512], seed)
    made = {
        "sgd": lambda: keras.optimizers.SGD(0.01),
        "adam": lambda: keras.optimizers.Adam(1e-3),
        "lars": lambda: LARS(1.0, momentum=0.9),
        "lamb": lambda: keras.optimizers.Lamb(1e-3),
    }[optimizer]()
    model.compile(optimizer=made, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _log(message: str) -> None:
    print(f"# {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
