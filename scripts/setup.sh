#!/usr/bin/env bash
# Creates .venv (Python 3.10-3.12) and installs sparkdl with the extras named in $1.
# Needs Java 17 on PATH for Spark. Idempotent: a second run only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
# pip stays current too: scripts/check_conf.sh plans the conf/ recipes with it.
.venv/bin/python -m pip install --quiet --upgrade pip
# shellcheck source=scripts/install.sh
. scripts/install.sh
install_into .venv -e ".[${extras}]"
java -version >/dev/null 2>&1 || { echo "Java 17 is required by Spark: install a JDK 17 and put java on PATH" >&2; exit 1; }
