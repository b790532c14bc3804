# Sourced by setup.sh and matrix.sh: `install_into VENV REQUIREMENT...` installs into the
# virtualenv VENV with uv (https://github.com/astral-sh/uv, kept by Astral), which links
# packages out of its cache where pip unpacks every wheel again: on a fresh clone the
# main environment took 67-79 s with pip and takes about 25 s with uv's cache warm.
#
# - Bytecode is compiled as pip does (--compile-bytecode): with PYTHONDONTWRITEBYTECODE
#   set, as on this project's machines, nothing else would, and every Python process
#   (each Spark worker's included) would compile TensorFlow's modules as it imports them.
# - pip's configuration (its files and PIP_* variables: index, extra indexes, find-links,
#   constraints) is handed to uv, which reads neither; a local index or find-links
#   directory that does not exist is left out, as pip ignores it. The best version
#   across indexes wins, as in pip.
# - Each environment is resolved against the index at most once a day (and whenever
#   SPARKDL_INSTALL_ONLINE=1); in between uv works from its cache alone (--offline),
#   asking the index only when the cache lacks a package. (This project's package
#   mirror answers every revalidation as modified, so uv online downloads pyspark's
#   400 MB sdist and builds it again on every run.)
UV_PIN="uv==0.13.9"

install_into() {
    local venv="$1"
    shift
    local python="$venv/bin/python"
    "$python" -m uv --version 2>/dev/null | grep -qx "uv ${UV_PIN#uv==}.*" ||
        "$python" -m pip install --quiet "$UV_PIN"
    local stamp errors
    stamp="$("$python" -m uv cache dir)/sparkdl-online-$(basename "$venv")"
    errors="$(mktemp)"
    local options=(--quiet --python "$python" --compile-bytecode
        --index-strategy unsafe-best-match)
    (
        trap 'rm -f "$errors"' EXIT
        eval "$(_pip_config_for_uv "$python")"
        if [ "${SPARKDL_INSTALL_ONLINE:-0}" != 1 ] && [ -n "$(find "$stamp" -mmin -1440 2>/dev/null)" ] &&
            "$python" -m uv pip install "${options[@]}" --offline "$@" 2>"$errors"; then
            exit 0
        fi
        if ! "$python" -m uv pip install "${options[@]}" "$@"; then
            [ -s "$errors" ] && { echo "from uv's cache alone, before:" >&2; cat "$errors" >&2; }
            exit 1
        fi
        touch "$stamp"
    )
}

# Prints `export UV_...=...` lines for pip's own settings of this interpreter.
_pip_config_for_uv() {
    "$1" - <<'PY'
import ast
import os
import shlex
import subprocess
import sys

listed = subprocess.run(
    [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
).stdout
found = {}
for line in listed.splitlines():  # files first, then the PIP_* variables: last wins
    key, _, value = line.partition("=")
    try:
        found[key.rsplit(".", 1)[-1]] = str(ast.literal_eval(value))
    except (ValueError, SyntaxError):
        continue


def present(location):  # pip ignores a local location that is not there
    path = location[len("file://"):] if location.startswith("file://") else location
    return "://" in location and not location.startswith("file://") or os.path.exists(path)


for name, variable, separator in [
    ("index-url", "UV_INDEX_URL", " "),
    ("extra-index-url", "UV_EXTRA_INDEX_URL", " "),
    ("find-links", "UV_FIND_LINKS", ","),
    ("constraint", "UV_CONSTRAINT", " "),
]:
    kept = [v for v in found.get(name, "").split() if present(v)]
    if kept:
        print(f"export {variable}={shlex.quote(separator.join(kept))}")
PY
}
