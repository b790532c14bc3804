#!/usr/bin/env bash
# Dataproc initialization action for image 2.2 (Spark 3.5, Python 3.11 from conda at
# /opt/conda/default): installs sparkdl on every node in a virtual environment of its own,
# /opt/sparkdl, built from the image's Python 3.11. The image's conda environment and
# Spark (which provides pyspark) are left alone. Versions and sources:
# conf/constraints/dataproc-2.2.txt.
# Upload this script and conf/constraints/dataproc-2.2.txt to Cloud Storage, then:
#   gcloud dataproc clusters create NAME --image-version=2.2-debian12 \
#     --initialization-actions=gs://BUCKET/sparkdl/dataproc-2.2-init.sh \
#     --metadata=sparkdl-constraints=gs://BUCKET/sparkdl/dataproc-2.2.txt \
#     --properties='spark:spark.pyspark.python=/opt/sparkdl/bin/python,spark:spark.pyspark.driver.python=/opt/sparkdl/bin/python,spark:spark.python.worker.reuse=true'
# Init actions run as root on every node. A metadata key sparkdl-spec may name another
# sparkdl requirement or a wheel.
set -euo pipefail
metadata() { /usr/share/google/get_metadata_value "attributes/$1" 2>/dev/null || true; }
constraints_uri="$(metadata sparkdl-constraints)"
[ -n "$constraints_uri" ] || { echo "set the metadata key sparkdl-constraints (gs://.../dataproc-2.2.txt)" >&2; exit 1; }
SPARKDL="$(metadata sparkdl-spec)"
SPARKDL="${SPARKDL:-sparkdl-keras==0.1.0}"
EXTRAS="tensorflow"
# Nothing of the image is upgraded: the environment is new.
UPGRADE=""
VENV=/opt/sparkdl
PYTHON=/opt/conda/default/bin/python3

work="$(mktemp -d)"
gcloud storage cp --quiet "$constraints_uri" "$work/constraints.txt"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# sparkdl without its dependencies: its pyspark requirement would put pip's pyspark beside
# Dataproc's Spark, whose pyspark the Python workers get on their path.
"$VENV/bin/python" -m pip install --quiet --no-deps "$SPARKDL"
# sparkdl's other requirements for EXTRAS, less pyspark (read from its metadata).
"$VENV/bin/python" -m sparkdl.requirements "$EXTRAS" >"$work/requirements.txt"
# Pinned to the stack the CI runs with Spark 3.5 (the constraints file).
"$VENV/bin/python" -m pip install --quiet -c "$work/constraints.txt" -r "$work/requirements.txt"
rm -rf "$work"
