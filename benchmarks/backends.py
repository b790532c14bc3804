"""One benchmark on TensorFlow, JAX and PyTorch, side by side in one invocation.

Runs ``benchmarks/digits.py`` (or ``scale.py``) once per backend, each in its own
process (Keras picks its backend at import), in turn (TensorFlow, JAX, PyTorch, then
again when ``--rounds`` > 1), with the Python that has that backend: by default
``.venv`` for TensorFlow, ``.venv-jax`` (``bash scripts/matrix.sh jax`` builds it: Keras
on JAX, no TensorFlow installed) for JAX and ``.venv-torch`` (``bash scripts/matrix.sh
torch``: Keras on PyTorch's CPU build, neither TensorFlow nor JAX) for PyTorch. Prints
each run's table under a heading naming the backend and its Python; the arguments after
``--`` go to the benchmark.

Run:
    .venv/bin/python benchmarks/backends.py -- --repeats 1 --frequencies epoch
    .venv/bin/python benchmarks/backends.py --bench scale -- --rows 200000 --only scale
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", choices=["digits", "scale"], default="digits")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each backend, in turn")
    parser.add_argument(
        "--python",
        action="append",
        default=[],
        metavar="BACKEND=PATH",
        help="the interpreter of a backend (default: tensorflow=.venv, jax=.venv-jax, "
        "torch=.venv-torch)",
    )
    args, rest = parser.parse_known_args()
    rest = rest[1:] if rest[:1] == ["--"] else rest
    pythons = {
        "tensorflow": os.path.join(ROOT, ".venv", "bin", "python"),
        "jax": os.path.join(ROOT, ".venv-jax", "bin", "python"),
        "torch": os.path.join(ROOT, ".venv-torch", "bin", "python"),
    }
    for item in args.python:
        name, _, path = item.partition("=")
        pythons[name] = path
    script = os.path.join(ROOT, "benchmarks", f"{args.bench}.py")
    for round_ in range(args.rounds):
        for backend, python in pythons.items():
            if not os.path.exists(python):
                raise SystemExit(f"no Python for {backend}: {python} (see --python)")
            started = time.perf_counter()
            out = subprocess.run(
                [python, script, "--backend", backend, *rest],
                check=True,
                capture_output=True,
                text=True,
                env={**os.environ, "PYSPARK_PYTHON": python},
            ).stdout
            seconds = time.perf_counter() - started
            print(f"\n### {backend} ({python}), round {round_ + 1}, {seconds:.0f} s in all")
            print(out, flush=True)


if __name__ == "__main__":
    sys.exit(main())
