#!/usr/bin/env bash
# Databricks init script for Databricks Runtime 16.4 and 17.3 LTS ML: installs sparkdl on
# every node (driver included) without replacing the runtime's pyspark, TensorFlow or
# numpy. Upload it to the workspace (/Shared/sparkdl/databricks-init.sh) and name it in
# the cluster spec (conf/databricks-cluster.json for 16.4, conf/databricks-17.3-cluster.json
# for 17.3), whose spark_env_vars.SPARKDL_UPGRADE lists what that runtime ships older than
# sparkdl needs, upgraded on purpose. The runtimes' versions and sources:
# conf/constraints/databricks-16.4-ml.txt and databricks-17.3-ml.txt.
set -euo pipefail
PY=/databricks/python3/bin/python
# sparkdl itself: a version from PyPI, or the path of a wheel on a volume.
SPARKDL="${SPARKDL:-sparkdl-keras==0.1.0}"
# The backend is the runtime's TensorFlow; MLflow is the runtime's too.
EXTRAS="tensorflow,mlflow"
[ -n "${SPARKDL_UPGRADE+set}" ] || {
    echo "set spark_env_vars.SPARKDL_UPGRADE in the cluster spec (conf/databricks-cluster.json)" >&2
    exit 1
}
UPGRADE="$SPARKDL_UPGRADE"

work="$(mktemp -d)"
# 1. The runtime's packages, at their versions, as constraints, less the upgrades.
upgraded="$(echo "$UPGRADE" | sed 's/==[^ ]*//g; s/ /|/g')"
"$PY" -m pip list --format=freeze | grep -viE "^(${upgraded})==" >"$work/runtime.txt"
# 2. sparkdl without its dependencies: its pyspark requirement would pull pip's pyspark
#    over Databricks' own, which is not a pip distribution.
"$PY" -m pip install --quiet --no-deps "$SPARKDL"
# 3. sparkdl's other requirements for EXTRAS, less pyspark (read from its metadata).
"$PY" -m sparkdl.requirements "$EXTRAS" >"$work/requirements.txt"
# 4. Those and the upgrades; pip fails rather than move a package the runtime pins.
# shellcheck disable=SC2086
"$PY" -m pip install --quiet -c "$work/runtime.txt" -r "$work/requirements.txt" $UPGRADE
rm -rf "$work"
