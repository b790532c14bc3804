#!/usr/bin/env bash
# Builds the virtual environment of one stack of the compatibility matrix and runs the
# compatibility subset (pytest -m compat) in it:
#   bash scripts/matrix.sh oldest   PySpark 3.5, TensorFlow 2.16, numpy 1.26 (.venv-oldest)
#   bash scripts/matrix.sh jax      PySpark 4.2, Keras on JAX, no TensorFlow (.venv-jax)
#   bash scripts/matrix.sh torch    PySpark 4.3, Keras on PyTorch (CPU), no TF or JAX
#                                   (.venv-torch)
#   bash scripts/matrix.sh jax --setup-only    builds (or checks) the environment only
# The stack's pins are tests/matrix/<name>.txt (a pip constraints file); its header
# names the extras to install, the environment the tests run in and pytest's selection. A second run
# reinstalls nothing that is in place (uv checks the pins, from its cache or PyPI).
# `bash scripts/test.sh --all` runs the three; the main environment (.venv) is the
# newest of everything.
set -euo pipefail
cd "$(dirname "$0")/.."
name="${1:?usage: bash scripts/matrix.sh oldest|jax|newest|torch [pytest arguments]}"
shift
pins="tests/matrix/${name}.txt"
[ -f "$pins" ] || { echo "no stack named $name: $pins is missing" >&2; exit 2; }
extras="$(sed -n 's/^# extras: *//p' "$pins")"
environment="$(sed -n 's/^# env: *//p' "$pins")"
selection="$(sed -n 's/^# pytest: *//p' "$pins")"
venv=".venv-${name}"
python="${PYTHON:-python3}"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
# shellcheck source=scripts/install.sh
. scripts/install.sh
install_into "$venv" -c "$pins" -e ".[${extras}]"
# What the pins promise is what got installed (the installer would say nothing of a package that
# another requirement pulled in at another version).
"$venv/bin/python" - "$pins" <<'PY'
import sys
from importlib import metadata, util

def installed(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"

pins = [l.split("==") for l in open(sys.argv[1]) if "==" in l and not l.startswith("#")]
wrong = [f"{n.strip()} {installed(n.strip())} (pinned {v.strip()})"
         for n, v in pins if installed(n.strip()) != v.strip()]
text = open(sys.argv[1]).read()
others = {"jax": ["tensorflow"], "torch": ["tensorflow", "jax"]}
for backend, absent in others.items():
    if f"KERAS_BACKEND={backend}" in text:
        wrong += [f"{p} is installed in a stack that must run without it"
                  for p in absent if util.find_spec(p)]
if wrong:
    sys.exit("stack " + sys.argv[1] + ": " + "; ".join(wrong))
PY
if [ "${1:-}" = "--setup-only" ]; then exit 0; fi
export TF_CPP_MIN_LOG_LEVEL=2 SPARK_LOCAL_IP=127.0.0.1
# shellcheck disable=SC2086
env $environment "$venv/bin/python" -c 'import keras, numpy, pyspark
print("== compatibility subset: pyspark", pyspark.__version__, "keras", keras.__version__,
      "on", keras.backend.backend(), "numpy", numpy.__version__)'
# Only the modules that hold compat tests are collected (others import dev-only tools).
files="$(grep -rl --include='test_*.py' 'pytest.mark.compat' tests | sort)"
# shellcheck disable=SC2086
env $environment "$venv/bin/python" -m pytest $files -m compat $selection -p no:cacheprovider "$@"
