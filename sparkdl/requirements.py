"""sparkdl's own requirements for some extras, less what a cluster's runtime provides.

The cluster recipes of ``conf/`` install sparkdl with ``pip install --no-deps`` (its
pyspark requirement would put pip's pyspark over the runtime's Spark), then what this
prints, under the runtime's constraints; ``scripts/check_conf.sh`` plans the same list
from a wheel built from the checkout. It reads the distribution's metadata and imports
nothing beyond the standard library, so it runs before sparkdl's dependencies are in::

    python -m sparkdl.requirements tensorflow,mlflow
    python -m sparkdl.requirements tensorflow --wheel dist/sparkdl_keras-0.1.0-py3-none-any.whl

Example:
    >>> declared = ['pyspark<4.2,>=3.5', 'numpy<3,>=1.26',
    ...             'tensorflow<2.22,>=2.16; extra == "tensorflow"', 'jax>=0.10; extra == "jax"']
    >>> requirements(["tensorflow"], declared)
    ['numpy<3,>=1.26', 'tensorflow<2.22,>=2.16']
"""

from __future__ import annotations

import argparse
import re
import sys
import zipfile
from collections.abc import Iterable, Sequence
from importlib import metadata

__all__ = ["DISTRIBUTION", "PROVIDED", "declared", "main", "requirements"]

#: The distribution sparkdl is installed as.
DISTRIBUTION = "sparkdl-keras"
#: What every cluster runtime provides itself: its Spark's pyspark.
PROVIDED = ("pyspark",)


def requirements(
    extras: Iterable[str], declared_lines: Sequence[str], provided: Sequence[str] = PROVIDED
) -> list[str]:
    """The requirements of ``declared_lines`` (``Requires-Dist`` values) that apply with
    ``extras``, less those naming a ``provided`` package."""
    wanted = set(extras)
    out = []
    for line in declared_lines:
        requirement, _, marker = line.partition(";")
        name = re.match(r"\s*([A-Za-z0-9_.-]+)", requirement)
        if name is None or name.group(1).lower() in provided:
            continue
        needs = set(re.findall(r'extra\s*==\s*"([^"]+)"', marker))
        if not marker.strip() or needs & wanted:
            out.append(requirement.strip())
    return out


def declared(wheel: str | None = None) -> list[str]:
    """The ``Requires-Dist`` values of the installed sparkdl, or of ``wheel``."""
    if wheel is None:
        return list(metadata.requires(DISTRIBUTION) or [])
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(name).decode()
    return [
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("Requires-Dist:")
    ]


def main(argv: Sequence[str] | None = None) -> None:
    """Prints one requirement a line (see the module's docstring)."""
    parser = argparse.ArgumentParser(prog="python -m sparkdl.requirements")
    parser.add_argument("extras", help="comma-separated extras, e.g. tensorflow,mlflow")
    parser.add_argument("--wheel", help="read a wheel's metadata, not the installed sparkdl")
    args = parser.parse_args(argv)
    extras = [e for e in args.extras.split(",") if e]
    for line in requirements(extras, declared(args.wheel)):
        print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
