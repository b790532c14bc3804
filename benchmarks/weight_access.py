"""A worker's weight reads and writes per sync, on the backend this Python runs.

Times ``backend_for(backend).weight_access(model)``'s ``get`` and ``set`` (what a
worker does at every sync) against Keras's own ``get_weights``, on the digits MLP or a
wider one, in one process without Spark. ``benchmarks/backends.py`` does not run it:
run it once per stack, with ``KERAS_BACKEND`` set.

Run:
    KERAS_BACKEND=torch .venv-torch/bin/python benchmarks/weight_access.py --calls 500
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--width", type=int, default=0, help="0: the digits MLP")
    args = parser.parse_args()
    import keras

    from examples.digits import digits_model
    from sparkdl.executor.backends import backend_for
    from sparkdl.executor.weight_access import WeightAccess

    if args.width:
        model = keras.Sequential(
            [keras.Input((100,)), keras.layers.Dense(args.width), keras.layers.Dense(10)]
        )
    else:
        model = digits_model()
    backend = keras.backend.backend()
    access = backend_for(backend).weight_access(model)
    arrays = access.get()

    def per_call(call) -> float:  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        for _ in range(args.calls):
            call()
        return (time.perf_counter() - started) / args.calls * 1e6

    get, put = per_call(access.get), per_call(lambda: access.set(arrays))
    keras_get = per_call(WeightAccess(model).get)
    params = sum(a.size for a in arrays)
    print(
        f"{backend}: get {get:.0f} us, set {put:.0f} us, Keras get_weights {keras_get:.0f} us "
        f"({len(arrays)} arrays, {params} parameters, {args.calls} calls each)"
    )


if __name__ == "__main__":
    main()
