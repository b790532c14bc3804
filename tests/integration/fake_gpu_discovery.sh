#!/usr/bin/env bash
# A fake GPU discovery script for Spark workers: each worker that runs it claims the next
# id (0, 1, ...) through an atomic mkdir in $FAKE_GPU_DIR, so every worker has one GPU of
# its own. No GPU exists: TensorFlow falls back to the CPU.
set -euo pipefail
dir="${FAKE_GPU_DIR:?}"
i=0
until mkdir "${dir}/gpu-${i}" 2>/dev/null; do i=$((i + 1)); done
echo "{\"name\": \"gpu\", \"addresses\": [\"${i}\"]}"
