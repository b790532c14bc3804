"""Mixed precision: what a worker's model build costs, and what each way gives.

A worker with ``mixed_precision=True`` rebuilds the user's model from its ``.keras``
bytes (:func:`sparkdl.executor.precision.mixed_precision_model`: a
``keras.models.clone_model`` with a ``mixed_float16`` policy per layer, compiled again).
Before it, the archive's config was edited (each non-output layer's ``dtype`` set to
``mixed_float16``) and loaded: that edit is copied here as :func:`zip_rewrite_bytes`
(``sparkdl/contract/keras_io.py`` up to commit 5087283) to compare.

For each model, the seconds from the bytes to a compiled model, as the median (min-max)
of ``--repeats`` builds, the three ways interleaved: a plain float32 load (what a worker
does without mixed precision), the archive edit, the clone; and what each way gave: the
optimizer's class, the distinct compute dtypes of the non-output layers (nested ones
included) and whether the outputs are float32.

Models: digits (the demo's 64-64-10 MLP, Adam, ``examples/digits.py``), a functional
model with a nested Sequential block (64 -> [256 x4] -> 10), and ResNet50
(``keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3), classes=10)``:
23.6M parameters, a 95 MB archive, no download). One process, CPU only, one build at a time.

Run:
    .venv/bin/python benchmarks/mixed_precision.py
    .venv/bin/python benchmarks/mixed_precision.py --repeats 3 --only digits
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
import zipfile
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def zip_rewrite_bytes(data: bytes) -> bytes:
    """The archive edit sparkdl used before the clone (``keras_io.mixed_precision_bytes``
    at commit 5087283): each layer of the top-level config but the outputs, and the
    model, get a ``mixed_float16`` dtype."""
    policy = {
        "module": "keras",
        "class_name": "DTypePolicy",
        "config": {"name": "mixed_float16"},
        "registered_name": None,
    }
    source = zipfile.ZipFile(io.BytesIO(data))
    config = json.loads(source.read("config.json"))
    inner = config.get("config", {})
    layers = inner.get("layers", [])
    value = inner.get("output_layers")
    if not value:
        refs: list[Any] = []
    elif isinstance(value, list) and isinstance(value[0], str):
        refs = [value]
    elif isinstance(value, dict):
        refs = [v for v in value.values() if isinstance(v, list)]
    else:
        refs = [v for v in value if isinstance(v, list)]
    outputs = {str(ref[0]) for ref in refs}
    if not outputs and layers:
        outputs = {layers[-1].get("config", {}).get("name")}
    for layer in layers:
        layer_config = layer.get("config", {})
        if layer.get("class_name") == "InputLayer" or layer_config.get("name") in outputs:
            continue
        layer_config["dtype"] = dict(policy)
    inner["dtype"] = dict(policy)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as target:
        for item in source.infolist():
            payload = (
                json.dumps(config).encode()
                if item.filename == "config.json"
                else source.read(item.filename)
            )
            target.writestr(item, payload)
    return out.getvalue()


def models(only: str | None) -> dict[str, Any]:
    import keras

    from examples.digits import digits_model

    found: dict[str, Any] = {}
    if only in (None, "digits"):
        found["digits"] = digits_model()
    if only in (None, "nested"):
        block = keras.Sequential(
            [keras.Input((64,))] + [keras.layers.Dense(256, activation="relu") for _ in range(4)],
            name="block",
        )
        inputs = keras.Input((64,))
        outputs = keras.layers.Dense(10, activation="softmax")(block(inputs))
        nested = keras.Model(inputs, outputs)
        nested.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        found["nested"] = nested
    if only in (None, "resnet50"):
        resnet = keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3), classes=10)
        resnet.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        found["resnet50"] = resnet
    return found


def facts(model: Any) -> tuple[str, list[str], bool]:
    """The optimizer's class, the non-output layers' compute dtypes, float32 outputs."""
    import keras

    from sparkdl.compat.keras import flatten_layers
    from sparkdl.executor.precision import _output_layers

    keep = _output_layers(model)
    layers = [
        layer
        for layer in flatten_layers(model)
        if not isinstance(layer, (keras.Model, keras.layers.InputLayer))
    ]
    hidden = {str(layer.compute_dtype) for layer in layers if id(layer) not in keep}
    outputs = all(str(layer.compute_dtype) == "float32" for layer in layers if id(layer) in keep)
    return type(model.optimizer).__name__, sorted(hidden), outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", choices=["digits", "nested", "resnet50"])
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from sparkdl.contract.keras_io import model_from_bytes, model_to_bytes
    from sparkdl.executor.precision import mixed_precision_model

    ways: dict[str, Callable[[bytes], Any]] = {
        "float32 load": model_from_bytes,
        "archive edit": lambda data: model_from_bytes(zip_rewrite_bytes(data)),
        "clone": mixed_precision_model,
    }
    for name, model in models(args.only).items():
        data = model_to_bytes(model)
        print(f"\n{name}: {model.count_params():,} parameters, {len(data) / 1e6:.1f} MB archive")
        seconds: dict[str, list[float]] = {way: [] for way in ways}
        built: dict[str, Any] = {}
        for _ in range(args.repeats):
            for way, build in ways.items():
                start = time.perf_counter()
                built[way] = build(data)
                seconds[way].append(time.perf_counter() - start)
        for way, times in seconds.items():
            optimizer, hidden, outputs = facts(built[way])
            print(
                f"  {way:13s} {statistics.median(times):6.3f} s "
                f"({min(times):.3f}-{max(times):.3f})  optimizer {optimizer}, "
                f"hidden layers {hidden}, float32 outputs {outputs}"
            )


if __name__ == "__main__":
    main()
