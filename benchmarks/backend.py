"""``--backend`` for the benchmarks: the Keras backend a benchmark process runs.

Keras reads ``KERAS_BACKEND`` once, at its import, so the choice is made from the
command line before anything imports it: :func:`select_backend` sets the variable from
``--backend NAME`` (or ``--backend=NAME``) and returns the backend the process will run;
importing this module does it for ``sys.argv`` (:data:`BACKEND`), so a benchmark imports
it before Keras.
sparkdl's executors then run the driver's backend. ``benchmarks/backends.py`` runs a
benchmark once per backend, side by side in one invocation.

Example:
    >>> select_backend(["digits.py", "--backend", "jax"], environ={})
    'jax'
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping, Sequence

__all__ = ["BACKEND", "BACKENDS", "select_backend"]

#: The backends sparkdl trains on.
BACKENDS = ("tensorflow", "jax", "torch")


def select_backend(
    argv: Sequence[str] | None = None, environ: MutableMapping[str, str] | None = None
) -> str:
    """Sets ``KERAS_BACKEND`` from ``--backend`` in ``argv`` (default ``sys.argv``);
    returns the backend Keras will load (``tensorflow`` when nothing says otherwise)."""
    args = list(sys.argv if argv is None else argv)
    env = os.environ if environ is None else environ
    for i, arg in enumerate(args):
        name = None
        if arg == "--backend" and i + 1 < len(args):
            name = args[i + 1]
        elif arg.startswith("--backend="):
            name = arg.split("=", 1)[1]
        if name is not None:
            if name not in BACKENDS:
                raise SystemExit(f"--backend must be one of {BACKENDS}, not {name!r}")
            env["KERAS_BACKEND"] = name
    return env.get("KERAS_BACKEND", "tensorflow")


#: The backend of this process, from its command line.
BACKEND = select_backend()
