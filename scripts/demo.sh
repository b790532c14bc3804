#!/usr/bin/env bash
# Installs what the demo needs and trains a Keras MLP on digits with sparkdl (local[*]).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
.venv/bin/python examples/digits_demo.py
