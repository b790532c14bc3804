"""Batch training from the command line: ``python -m sparkdl`` or the ``sparkdl`` script.

Reads a Parquet or CSV data set, imports a function that builds a compiled Keras model
(``module:function``), trains with settings from flags or a JSON config file (see
``conf/``), and saves the fitted KerasModel. Runs under ``spark-submit`` (which supplies
the master) or on its own (``--master``).

Example:
    >>> parse_args(["--data", "d.parquet", "--model", "m:f", "--output", "out",
    ...             "--epochs", "3", "--frequency", "4"]).settings
    {'frequency': 4, 'epochs': 3}
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

from sparkdl.config import TrainConfig, setting_docs, setting_fields
from sparkdl.errors import ConfigError

__all__ = ["main", "parse_args"]

_EXAMPLE = """
example:
  spark-submit --master yarn examples/digits_job.py \\
      --data hdfs:///data/digits.parquet --model digits_job:build_model \\
      --features-col features --label-col label --output hdfs:///models/digits \\
      --config conf/train-digits.json --epochs 20 --num-workers 4

A config file is JSON: {"data": ..., "model": ..., "output": ..., "features_col": ...,
"label_col": ..., "format": ..., "settings": {"epochs": 20, ...}}. Flags override it.
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one training job; returns the process exit status."""
    args = parse_args(argv)
    from pyspark.sql import SparkSession

    from sparkdl import KerasEstimator

    builder = SparkSession.builder.appName(args.app_name)
    if args.master:
        builder = builder.master(args.master)
    spark = builder.getOrCreate()
    try:
        reader = spark.read
        if args.format == "csv":
            reader = reader.option("header", True).option("inferSchema", True)
        df = reader.format(args.format).load(args.data)
        model = _load_builder(args.model)()
        features: Any = args.features_col[0] if len(args.features_col) == 1 else args.features_col
        estimator = KerasEstimator(
            model=model, features_col=features, label_col=args.label_col, **args.settings
        )
        start = time.perf_counter()
        fitted = estimator.fit(df)
        writer = fitted.write()
        if args.overwrite:
            writer = writer.overwrite()
        writer.save(args.output)
        summary = {
            "output": args.output,
            "seconds": round(time.perf_counter() - start, 3),
            "epochs": len(next(iter(fitted.history.values()), [])),
            "final": {k: v[-1] for k, v in fitted.history.items() if v},
        }
        print(json.dumps(summary), flush=True)
    finally:
        spark.stop()
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses the command line (and the ``--config`` file) into a namespace.

    ``namespace.settings`` holds the TrainConfig settings given, validated.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    config: dict[str, Any] = {}
    if args.config:
        with open(args.config) as f:
            config = json.load(f)
        if not isinstance(config, dict):
            parser.error(f"--config {args.config}: expected a JSON object")
    settings = dict(config.get("settings", {}))
    for field in setting_fields():
        value = getattr(args, f"setting_{field.name}")
        if value is not None:
            settings[field.name] = value
    try:
        TrainConfig(**settings)
    except (ConfigError, TypeError) as exc:
        parser.error(str(exc))
    args.settings = settings
    for name, default in [
        ("data", None),
        ("model", None),
        ("output", None),
        ("format", "parquet"),
        ("label_col", "label"),
        ("features_col", ["features"]),
    ]:
        if getattr(args, name) is None:
            value = config.get(name, default)
            if name == "features_col" and isinstance(value, str):
                value = [value]
            setattr(args, name, value)
    missing = [n for n in ("data", "model", "output") if not getattr(args, n)]
    if missing:
        parser.error("missing " + ", ".join(f"--{n}" for n in missing))
    return args


def _parser() -> argparse.ArgumentParser:
    """The command line: data, model and output, then one flag per TrainConfig setting."""
    parser = argparse.ArgumentParser(
        prog="python -m sparkdl",
        description="Train a Keras model on a Spark DataFrame and save the fitted model.",
        epilog=_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    io = parser.add_argument_group("data, model and output")
    io.add_argument("--config", help="JSON file with any of these options (flags override it)")
    io.add_argument("--data", help="input path (Parquet or CSV; any path Spark reads)")
    io.add_argument("--format", choices=["parquet", "csv"], help="input format (default parquet)")
    io.add_argument("--model", help="module:function that returns a compiled keras.Model")
    io.add_argument("--features-col", nargs="+", help="feature column, or several numeric columns")
    io.add_argument("--label-col", help="label column (default label)")
    io.add_argument("--output", help="where to save the fitted KerasModel")
    io.add_argument("--overwrite", action="store_true", help="replace an existing output")
    io.add_argument("--master", help="Spark master (spark-submit passes its own)")
    io.add_argument("--app-name", default="sparkdl-train", help="Spark application name")
    training = parser.add_argument_group("training settings (sparkdl.TrainConfig)")
    docs = setting_docs()
    for field in setting_fields():
        training.add_argument(
            "--" + field.name.replace("_", "-"),
            dest=f"setting_{field.name}",
            type=_converter(field.name),
            help=f"{_first_sentence(docs[field.name])} (default: {field.default!r})",
        )
    return parser


def _converter(name: str) -> Any:
    def convert(text: str) -> Any:
        if name == "frequency":
            return int(text) if text.isdigit() else text
        if text.lower() in ("none", "null"):
            return None
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return text

    return convert


def _load_builder(spec: str) -> Any:
    module_name, _, function = spec.partition(":")
    if not module_name or not function:
        raise ConfigError(f"Expected --model as module:function. Received: {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"Could not import {module_name!r} for --model: {exc}. Put it on PYTHONPATH "
            "(spark-submit --py-files ships it to the cluster)."
        ) from exc
    builder = getattr(module, function, None)
    if not callable(builder):
        raise ConfigError(f"{module_name!r} has no function {function!r} for --model.")
    return builder


def _first_sentence(text: str) -> str:
    """The first sentence of a setting's description for ``--help``: plain text (reST
    roles and literals unwrapped), ``%`` escaped; "et al." and "e.g." end no sentence."""
    plain = re.sub(r":\w+:`~?([^`]+)`", r"\1", text).replace("``", "")
    head = re.split(r"(?<!\bal)(?<!\be\.g)(?<!\bi\.e)\.\s+(?=[A-Z`(\"])", plain, maxsplit=1)[0]
    return head.rstrip(".").replace("%", "%%")


if __name__ == "__main__":
    sys.exit(main())
