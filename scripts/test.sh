#!/usr/bin/env bash
# Installs what the tests need, lints, type-checks, then runs a tier of the test suite:
#   bash scripts/test.sh          the fast tier: unit tests, doctests and in-process Spark
#                                 tests (pytest -m "not slow"; at most 6 minutes here)
#   bash scripts/test.sh --all    every test: adds the tier that starts clusters,
#                                 subprocesses and many-worker fits, builds the docs
#                                 strictly (bash scripts/docs.sh), runs the
#                                 compatibility subset in the other stacks of the matrix
#                                 (bash scripts/matrix.sh oldest|jax|torch) and checks the
#                                 conf/ recipes (bash scripts/check_conf.sh); what CI runs
# Each tier ends with tests/connect, the same tier over a Spark Connect session, in a
# pytest process of its own (a Connect session marks its whole process as a client).
# Other arguments pass through to the main pytest run (tests/connect is left out then),
# e.g. `bash scripts/test.sh tests/unit -q`.
set -euo pipefail
cd "$(dirname "$0")/.."
all=0
args=()
for arg in "$@"; do
    if [ "$arg" = "--all" ]; then all=1; else args+=("$arg"); fi
done
# Each stage's wall time, on stderr (docs/contributing.md quotes them).
timed() {
    local start=$SECONDS
    "$@"
    echo "== stage took $((SECONDS - start)) s: $*" >&2
}
if [ "$all" = 1 ]; then
    timed bash scripts/setup.sh dev,docs
    # Built first: a test of the main suite runs executors on another stack's Python.
    timed bash scripts/matrix.sh oldest --setup-only
    timed bash scripts/matrix.sh jax --setup-only
    timed bash scripts/matrix.sh torch --setup-only
else
    bash scripts/setup.sh dev
fi
export TF_CPP_MIN_LOG_LEVEL=2 SPARK_LOCAL_IP=127.0.0.1
.venv/bin/ruff check sparkdl tests examples benchmarks docs
.venv/bin/ruff format --check sparkdl tests examples benchmarks docs
.venv/bin/mypy
if [ "$all" = 1 ]; then
    timed .venv/bin/python -m pytest --doctest-modules sparkdl tests -p no:cacheprovider ${args[@]+"${args[@]}"}
    timed env SPARKDL_CONNECT_TESTS=1 .venv/bin/python -m pytest tests/connect -p no:cacheprovider
    # The compatibility subset over a Connect client of local[2]. Left out: the tests
    # that start a second driver process (it would start a second local server on the
    # first one's port) and the executors' Python (a setting of the server, not the client).
    timed env SPARKDL_TEST_REMOTE=1 .venv/bin/python -m pytest tests/integration -m compat \
        -p no:cacheprovider -q \
        --deselect tests/integration/test_backends.py::test_executors_without_the_backend_fail_before_training_naming_the_extra \
        --deselect tests/integration/test_spark_ml.py::test_pipeline_fits_saves_and_loads_in_a_new_session
    timed env SPARKDL_SETUP_DONE=1 bash scripts/docs.sh
    timed env SPARKDL_SETUP_DONE=1 bash scripts/release.sh  # sdist and wheel built, checked, installed
    timed bash scripts/matrix.sh oldest -q
    timed bash scripts/matrix.sh jax -q
    timed bash scripts/matrix.sh torch -q
    # The cluster recipes of conf/ against their runtimes' versions (pip's plan, no cluster).
    timed bash scripts/check_conf.sh
else
    .venv/bin/python -m pytest --doctest-modules sparkdl tests -p no:cacheprovider \
        -m "not slow" ${args[@]+"${args[@]}"}
    if [ ${#args[@]} = 0 ]; then
        SPARKDL_CONNECT_TESTS=1 .venv/bin/python -m pytest tests/connect -p no:cacheprovider \
            -m "not slow"
    fi
fi
