#!/usr/bin/env bash
# Databricks init script for Databricks Runtime 16.4 LTS ML (Spark 3.5.2, Python 3.12,
# TensorFlow 2.17.0): installs sparkdl on every node (driver included) without replacing
# the runtime's pyspark, TensorFlow or numpy. Versions and sources:
# conf/constraints/databricks-16.4-ml.txt (release notes:
# https://docs.databricks.com/aws/en/release-notes/runtime/16.4lts-ml).
# Upload it to the workspace (/Shared/sparkdl/databricks-16.4-init.sh) and name it in the
# cluster spec (conf/databricks-cluster.json).
set -euo pipefail
PY=/databricks/python3/bin/python
# sparkdl itself: a version from PyPI, or the path of a wheel on a volume.
SPARKDL="${SPARKDL:-sparkdl-keras==0.1.0}"
# The backend is the runtime's TensorFlow; MLflow is the runtime's too.
EXTRAS="tensorflow,mlflow"
# What the runtime ships older than sparkdl needs, upgraded on purpose (runtime: keras
# 3.9.0, below the 3.14 floor of safe_mode hardening; pandas 1.5.3; flask 2.2.5;
# cloudpickle 2.2.1). Nothing else of the runtime may change.
UPGRADE="keras==3.14.0 pandas==2.2.3 flask==3.0.3 cloudpickle==3.0.0"

work="$(mktemp -d)"
# 1. The runtime's packages, at their versions, as constraints, less the upgrades.
upgraded="$(echo "$UPGRADE" | sed 's/==[^ ]*//g; s/ /|/g')"
"$PY" -m pip list --format=freeze | grep -viE "^(${upgraded})==" >"$work/runtime.txt"
# 2. sparkdl without its dependencies: its pyspark requirement would pull pip's pyspark
#    over Databricks' own, which is not a pip distribution.
"$PY" -m pip install --quiet --no-deps "$SPARKDL"
# 3. sparkdl's other requirements for EXTRAS (read from its metadata), less pyspark.
"$PY" - "$EXTRAS" >"$work/requirements.txt" <<'PYCODE'
import re, sys
from importlib.metadata import requires

extras = set(sys.argv[1].split(","))
for line in requires("sparkdl-keras") or []:
    req, _, marker = line.partition(";")
    wanted = set(re.findall(r'extra\s*==\s*"([^"]+)"', marker))
    if not re.match(r"\s*pyspark\b", req) and (not marker.strip() or extras & wanted):
        print(req.strip())
PYCODE
# 4. Those and the upgrades; pip fails rather than move a package the runtime pins.
# shellcheck disable=SC2086
"$PY" -m pip install --quiet -c "$work/runtime.txt" -r "$work/requirements.txt" $UPGRADE
rm -rf "$work"
