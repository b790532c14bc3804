# Sourced by setup.sh and matrix.sh: `install_into VENV REQUIREMENT...` installs into the
# virtualenv VENV with uv (https://github.com/astral-sh/uv, kept by Astral), which links
# packages out of its cache where pip unpacks every wheel again: on a fresh clone the
# main environment took 67-79 s with pip and takes about 25 s with uv's cache warm.
# It compiles the packages' bytecode as pip does (--compile-bytecode): with
# PYTHONDONTWRITEBYTECODE set, as on this project's machines, nothing else would, and
# every Python process (each Spark worker's included) would compile TensorFlow's
# modules again as it imports them.
# uv is first asked to work from its cache alone (--offline), then, when the cache lacks
# something (a new machine, a changed pin), from the index. (This project's package
# mirror answers every revalidation as modified, so uv online downloads pyspark's
# 400 MB sdist and builds it again on every run.) pip's PIP_FIND_LINKS and
# PIP_EXTRA_INDEX_URL are passed on, and the best version across indexes wins, as in pip.
install_into() {
    local venv="$1" link url
    shift
    local options=(--quiet --python "$venv/bin/python" --compile-bytecode
        --index-strategy unsafe-best-match)
    for link in ${PIP_FIND_LINKS:-}; do options+=(--find-links "$link"); done
    for url in ${PIP_EXTRA_INDEX_URL:-}; do options+=(--extra-index-url "$url"); done
    "$venv/bin/python" -m uv --version >/dev/null 2>&1 ||
        "$venv/bin/python" -m pip install --quiet "uv>=0.5"
    "$venv/bin/python" -m uv pip install "${options[@]}" --offline "$@" 2>/dev/null ||
        "$venv/bin/python" -m uv pip install "${options[@]}" "$@"
}
