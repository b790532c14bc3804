#!/usr/bin/env bash
# Spark GPU discovery script: prints {"name": "gpu", "addresses": ["0", "1", ...]}.
set -euo pipefail
ids=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | tr -d ' ' | paste -sd, - || true)
if [ -z "${ids}" ]; then
  echo '{"name": "gpu", "addresses": []}'
else
  echo "{\"name\": \"gpu\", \"addresses\": [\"${ids//,/\",\"}\"]}"
fi
