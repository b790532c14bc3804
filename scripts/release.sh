#!/usr/bin/env bash
# Builds the release files and proves them, so that publishing is `twine upload dist/*`:
#   1. the sdist and the wheel into dist/ (python -m build, in an isolated environment);
#   2. their metadata (twine check --strict: the README renders on PyPI);
#   3. the wheel installed into a new, empty virtualenv WITH its dependencies from the
#      index (without extras: no TensorFlow), so its Requires-Dist resolve; there,
#      `python -m sparkdl.requirements`, a TrainConfig, and an import of every module of
#      the package (with Keras's numpy backend; modules that need an extra's package,
#      TensorFlow or JAX, may fail only for that package's absence).
# Usage: bash scripts/release.sh    (bash scripts/test.sh --all runs it after the docs)
# Needs the package index for step 3 (pyspark, keras, numpy...: pip's cache makes it quick).
# Step 3 installs with pip, as a user would; .venv's own packages come from uv
# (scripts/install.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
# The release extra brings build and twine into .venv.
[ "${SPARKDL_SETUP_DONE:-}" = 1 ] || bash scripts/setup.sh release
# shellcheck source=scripts/install.sh
. scripts/install.sh
.venv/bin/python -c "import build, twine" 2>/dev/null || install_into .venv -e ".[release]"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
rm -rf dist
.venv/bin/python -m build --outdir dist . >"$scratch/build.log" 2>&1 ||
    { cat "$scratch/build.log" >&2; echo "release: python -m build failed" >&2; exit 1; }
.venv/bin/python -m twine check --strict dist/*

version=$(.venv/bin/python -c "import sparkdl; print(sparkdl.__version__)")
wheel="dist/sparkdl_keras-${version}-py3-none-any.whl"
sdist="dist/sparkdl_keras-${version}.tar.gz"
for file in "$wheel" "$sdist"; do
    [ -f "$file" ] || { echo "release: $file was not built (version $version)" >&2; exit 1; }
done

.venv/bin/python -m venv "$scratch/venv"
"$scratch/venv/bin/python" -m pip install --quiet --upgrade pip
"$scratch/venv/bin/python" -m pip install --quiet "$wheel"
cd "$scratch"  # away from the checkout: the installed wheel is what gets imported
KERAS_BACKEND=numpy "$scratch/venv/bin/python" - "$version" <<'EOF'
import importlib
import pkgutil
import sys

import sparkdl

assert sparkdl.__version__ == sys.argv[1], (sparkdl.__version__, sys.argv[1])
assert "site-packages" in sparkdl.__file__, f"imported from {sparkdl.__file__}, not the wheel"
sparkdl.TrainConfig()  # every setting's default validates
# The extras' packages; scipy is what Keras's numpy backend, standing in here for an
# extra's backend, imports for its optimizers.
optional = {"tensorflow", "jax", "jaxlib", "mlflow", "tqdm", "scipy"}
failed = []
for module in pkgutil.walk_packages(sparkdl.__path__, "sparkdl."):
    if module.name == "sparkdl.__main__":  # runs the command line
        continue
    try:
        importlib.import_module(module.name)
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] not in optional:
            failed.append(f"{module.name}: {error!r}")
if failed:
    sys.exit("modules of the wheel that do not import:\n" + "\n".join(failed))
print(f"release: sparkdl {sparkdl.__version__} from the wheel imports, TrainConfig() validates")
EOF
# The installed distribution's metadata, as the cluster recipes of conf/ read it.
"$scratch/venv/bin/python" -m sparkdl.requirements tensorflow >"$scratch/requirements.txt"
grep -q "^tensorflow" "$scratch/requirements.txt" ||
    { cat "$scratch/requirements.txt" >&2; echo "release: no tensorflow requirement" >&2; exit 1; }
cd - >/dev/null
echo "release: $(ls dist | tr '\n' ' ')checked in $(($(date +%s) - started)) s;" \
    "publish with: .venv/bin/python -m twine upload dist/*"
