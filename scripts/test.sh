#!/usr/bin/env bash
# Installs what the tests need, then lints, type-checks and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
export TF_CPP_MIN_LOG_LEVEL=2 SPARK_LOCAL_IP=127.0.0.1
.venv/bin/ruff check sparkdl tests examples benchmarks
.venv/bin/ruff format --check sparkdl tests examples benchmarks
.venv/bin/mypy
.venv/bin/python -m pytest --doctest-modules sparkdl tests -p no:cacheprovider "$@"
