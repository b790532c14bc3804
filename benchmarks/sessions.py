"""One benchmark on a classic session and on a Spark Connect session, side by side.

Runs ``benchmarks/digits.py`` (or ``scale.py``) once on a classic ``local[2]`` session
and once with ``--connect`` (``remote("local[2]")``: a Connect server in the benchmark's
own JVM, the fit driven through its gRPC client), each in its own process (a Connect
session marks its whole process as a client), in turn (classic, Connect, then again
when ``--rounds`` > 1). Prints each run's table under a heading naming the session; the
arguments after ``--`` go to the benchmark.

Run:
    .venv/bin/python benchmarks/sessions.py -- --repeats 1 --frequencies epoch
    .venv/bin/python benchmarks/sessions.py --bench scale -- --rows 200000 --only scale
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
    args, rest = parser.parse_known_args()
    rest = rest[1:] if rest[:1] == ["--"] else rest
    script = os.path.join(ROOT, "benchmarks", f"{args.bench}.py")
    for round_ in range(args.rounds):
        for name, flags in (("classic", []), ("Spark Connect", ["--connect"])):
            started = time.perf_counter()
            out = subprocess.run(
                [sys.executable, script, *flags, *rest],
                check=True,
                capture_output=True,
                text=True,
                env={**os.environ, "PYSPARK_PYTHON": sys.executable},
            ).stdout
            seconds = time.perf_counter() - started
            print(f"\n### {name} session, round {round_ + 1}, {seconds:.0f} s in all")
            print(out, flush=True)


if __name__ == "__main__":
    sys.exit(main())
