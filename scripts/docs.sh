#!/usr/bin/env bash
# Installs what the docs need, then builds the site strictly (a warning fails the build).
# The site lands in docs/_build/html (open docs/_build/html/index.html).
set -euo pipefail
cd "$(dirname "$0")/.."
# `bash scripts/test.sh --all` installed the docs extra already and says so.
[ "${SPARKDL_SETUP_DONE:-}" = 1 ] || bash scripts/setup.sh dev,docs
export TF_CPP_MIN_LOG_LEVEL=3
rm -rf docs/_build/doctrees
.venv/bin/python -m sphinx -W --keep-going -q -b html -d docs/_build/doctrees docs docs/_build/html "$@"
echo "docs built: docs/_build/html/index.html"
