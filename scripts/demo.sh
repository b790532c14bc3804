#!/usr/bin/env bash
# Installs what the demo needs and trains a Keras MLP on digits with sparkdl (local[*]).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"  # a local demo: no hostname warning
.venv/bin/python examples/digits_demo.py
