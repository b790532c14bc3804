#!/usr/bin/env bash
# Databricks init script: installs sparkdl on every node of the cluster (driver included).
# Upload it to the workspace (/Shared/sparkdl/databricks-init.sh) and reference it from
# the cluster spec. The driver's parameter service is reached by the workers over the
# cluster's private network; Databricks allows it between nodes of one cluster.
set -euo pipefail
/databricks/python/bin/pip install --quiet "sparkdl-keras[mlflow]==0.1.0"
