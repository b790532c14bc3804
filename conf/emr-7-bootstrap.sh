#!/usr/bin/env bash
# Amazon EMR 7 bootstrap action: installs sparkdl on every node in a virtual environment
# of its own, /opt/sparkdl, built from python3.11. EMR 7's system python3 is 3.9, older
# than sparkdl's floor (3.10); 7.1 and later also ship 3.11 (emr-7.0.0 does not: not
# supported). The system Python, EMR's Spark (which provides pyspark) and EMR's TensorFlow
# application are left alone. Versions and sources: conf/constraints/emr-7.txt.
# Upload this script and conf/constraints/emr-7.txt to S3, then:
#   aws emr create-cluster --release-label emr-7.10.0 --applications Name=Spark \
#     --configurations file://conf/emr-7-configurations.json \
#     --bootstrap-actions Path=s3://BUCKET/sparkdl/emr-7-bootstrap.sh,Args=[s3://BUCKET/sparkdl/emr-7.txt] ...
# conf/emr-7-configurations.json points PYSPARK_PYTHON at /opt/sparkdl/bin/python.
set -euo pipefail
constraints_uri="${1:?usage: emr-7-bootstrap.sh s3://.../emr-7.txt [sparkdl requirement or wheel]}"
# sparkdl itself: a version from PyPI, or the path of a wheel.
SPARKDL="${2:-sparkdl-keras==0.1.0}"
EXTRAS="tensorflow"
# Nothing of the runtime is upgraded: the environment is new.
UPGRADE=""
VENV=/opt/sparkdl

command -v python3.11 >/dev/null || {
    echo "sparkdl needs Python 3.10 or later; this EMR release has no python3.11 (use emr-7.1.0 or later)" >&2
    exit 1
}
work="$(mktemp -d)"
aws s3 cp --quiet "$constraints_uri" "$work/constraints.txt"
sudo python3.11 -m venv "$VENV"
sudo "$VENV/bin/python" -m pip install --quiet --upgrade pip
# sparkdl without its dependencies: its pyspark requirement would put pip's pyspark beside
# EMR's Spark, whose pyspark the Python workers get on their path.
sudo "$VENV/bin/python" -m pip install --quiet --no-deps "$SPARKDL"
# sparkdl's other requirements for EXTRAS, less pyspark (read from its metadata).
"$VENV/bin/python" -m sparkdl.requirements "$EXTRAS" >"$work/requirements.txt"
# Pinned to the stack the CI runs with Spark 3.5 (the constraints file).
sudo "$VENV/bin/python" -m pip install --quiet -c "$work/constraints.txt" -r "$work/requirements.txt"
rm -rf "$work"
