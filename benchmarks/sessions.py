"""One benchmark on a classic session and on a Spark Connect session, side by side.

Runs ``benchmarks/digits.py`` (or ``scale.py``) on ``local[2]`` in up to three ways, each
in a process of its own (a Connect session marks its whole process as a client), in
turn (then again when ``--rounds`` > 1):

* ``classic``: a classic session, the parameter service in the driver (the default
  there);
* ``classic-cluster``: a classic session with ``service_placement="cluster"`` (the
  service beside worker 0 of the training job), which isolates what the placement
  costs from what the session kind costs;
* ``connect``: a Spark Connect session (``remote("local[2]")``: a Connect server in the
  benchmark's own JVM, the fit driven through its gRPC client), the service in the
  cluster (the default there).

Prints each run's table under a heading naming it; the arguments after ``--`` go to the
benchmark.

Run:
    .venv/bin/python benchmarks/sessions.py -- --repeats 1 --frequencies epoch
    .venv/bin/python benchmarks/sessions.py --bench scale -- --rows 200000 --only scale
    .venv/bin/python benchmarks/sessions.py --runs classic connect -- --repeats 1
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
    parser.add_argument("--rounds", type=int, default=1, help="runs of each session, in turn")
    parser.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS))
    args, rest = parser.parse_known_args()
    rest = rest[1:] if rest[:1] == ["--"] else rest
    script = os.path.join(ROOT, "benchmarks", f"{args.bench}.py")
    for round_ in range(args.rounds):
        for name in args.runs:
            title, flags = RUNS[name]
            started = time.perf_counter()
            out = subprocess.run(
                [sys.executable, script, *rest, *flags],  # the run's own flags last: they win
                check=True,
                capture_output=True,
                text=True,
                env={**os.environ, "PYSPARK_PYTHON": sys.executable},
            ).stdout
            seconds = time.perf_counter() - started
            print(f"\n### {title}, round {round_ + 1}, {seconds:.0f} s in all")
            print(out, flush=True)


#: Each run: its heading and the benchmark's flags.
RUNS: dict[str, tuple[str, list[str]]] = {
    "classic": ("classic session, service in the driver", []),
    "classic-cluster": (
        "classic session, service in the cluster",
        ["--set", "service_placement=cluster"],
    ),
    "connect": ("Spark Connect session, service in the cluster", ["--connect"]),
}

if __name__ == "__main__":
    sys.exit(main())
