#!/usr/bin/env bash
# Installs what the docs need, then builds the site strictly: a warning fails the build,
# and so do a reference to a sparkdl name that does not exist, in a page or in any
# docstring of sparkdl/ (docs/_ext/sparkdl_refs.py), and a link to an anchor no page has
# (docs/_ext/html_anchors.py). SPARKDL_DOCS_LINK_ALL=1 also lists the references to
# internals the site does not document (rendered as code, unlinked).
# The site lands in docs/_build/html (open docs/_build/html/index.html).
set -euo pipefail
cd "$(dirname "$0")/.."
# `bash scripts/test.sh --all` installed the docs extra already and says so.
[ "${SPARKDL_SETUP_DONE:-}" = 1 ] || bash scripts/setup.sh dev,docs
export TF_CPP_MIN_LOG_LEVEL=3
rm -rf docs/_build/doctrees docs/_build/html  # a full build: no page of an earlier one stays
.venv/bin/python -m sphinx -W --keep-going -q -b html -d docs/_build/doctrees docs docs/_build/html "$@"
echo "docs built: docs/_build/html/index.html"
