#!/usr/bin/env bash
# Checks the cluster recipes of conf/ against the runtimes they target, without a cluster:
# for each conf/constraints/<runtime>.txt (the runtime's package versions as pins), pip's
# resolver plans the install the recipe does, for the runtime's Python on manylinux x86_64,
# and the check fails if the plan cannot resolve or would install another version of a
# pinned (the runtime's) package. One line per runtime.
#   bash scripts/check_conf.sh            every file of conf/constraints/
#   bash scripts/check_conf.sh FILE...    those files
# It needs PyPI (or a warm pip cache). PYTHON picks the interpreter whose pip plans.
#
# What is resolved is what the recipes install: sparkdl's own requirements for the
# runtime's extras (read from the wheel built from this checkout), less pyspark, plus the
# packages the recipe upgrades on purpose (the file's `# upgrade:` line, which must match
# the recipe's UPGRADE, or the cluster spec's SPARKDL_UPGRADE). pyspark is left out
# because every runtime brings its own Spark (Databricks' pyspark is not even a pip
# distribution) and the recipes install sparkdl
# with --no-deps; it also could not be planned here: pyspark 3.5 is an sdist on PyPI, which
# a plan for another Python and platform (--only-binary=:all:) refuses.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
[ -x "$python" ] || python=python3
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# sparkdl's wheel: its METADATA holds the requirements the recipes read on the node.
"$python" -m pip wheel --quiet --no-deps -w "$tmp/wheel" . >/dev/null
wheel="$(ls "$tmp"/wheel/sparkdl_keras-*.whl)"

# manylinux tags up to glibc 2.34 (Amazon Linux 2023; Ubuntu 24.04 and Debian 12 are newer):
# pip takes --platform literally, so each tag a wheel may carry is named.
platforms=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
for minor in $(seq 17 34); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done

files=("$@")
[ ${#files[@]} -gt 0 ] || files=(conf/constraints/*.txt)
failed=0
for pins in "${files[@]}"; do
    name="$(basename "$pins" .txt)"
    header() { sed -n "s/^# $1: *//p" "$pins"; }
    pyver="$(header python)"
    extras="$(header extras)"
    recipe="$(header recipe)"
    upgrade="$(header upgrade)"
    if [ ! -f "$recipe" ]; then
        echo "$name: FAIL: its recipe ${recipe:-(no '# recipe:' line)} is missing"
        failed=1
        continue
    fi
    # The recipe must upgrade exactly what the constraints file says it does: its
    # UPGRADE, or (Databricks: one script for several runtimes) the cluster spec's
    # spark_env_vars.SPARKDL_UPGRADE.
    cluster="$(header cluster)"
    if [ -n "$cluster" ]; then
        recipe_upgrade="$("$python" -c 'import json, sys
print(json.load(open(sys.argv[1]))["spark_env_vars"].get("SPARKDL_UPGRADE", "(none)"))' "$cluster")"
    else
        recipe_upgrade="$(sed -n 's/^UPGRADE="\(.*\)"$/\1/p' "$recipe")"
    fi
    if [ "$recipe_upgrade" != "$upgrade" ]; then
        echo "$name: FAIL: ${cluster:-$recipe} upgrades \"$recipe_upgrade\", $pins says \"$upgrade\""
        failed=1
        continue
    fi
    # sparkdl's requirements for these extras, less pyspark (what the recipes install),
    # by the module the recipes run on the node.
    PYTHONPATH=. "$python" -m sparkdl.requirements "$extras" --wheel "$wheel" >"$tmp/$name.req"
    for pkg in $upgrade; do echo "$pkg" >>"$tmp/$name.req"; done
    start=$SECONDS
    if ! "$python" -m pip install --quiet --dry-run --ignore-installed --no-input \
        --report "$tmp/$name.json" --python-version "$pyver" --implementation cp \
        --only-binary=:all: "${platforms[@]}" \
        -c "$pins" -r "$tmp/$name.req" >"$tmp/$name.log" 2>&1; then
        echo "$name (Python $pyver): FAIL: the plan does not resolve"
        grep -E "ERROR|conflict|requires" "$tmp/$name.log" | head -n 8 | sed 's/^/    /'
        failed=1
        continue
    fi
    "$python" - "$pins" "$tmp/$name.json" "$name" "$pyver" "$upgrade" "$((SECONDS - start))" \
        "$tmp/$name.req" <<'PY' || failed=1
import json, re, sys

pins_file, report, name, pyver, upgrade, secs, reqs = sys.argv[1:]
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
pins = {}
for line in open(pins_file):
    line = line.split("#")[0].strip()
    if "==" in line:
        n, v = line.split("==")
        pins[norm(n)] = v.strip()
plan = {norm(i["metadata"]["name"]): i["metadata"]["version"]
        for i in json.load(open(report))["install"]}
moved = [f"{n} {pins[n]} -> {v}" for n, v in plan.items() if n in pins and v != pins[n]]
if "pyspark" in plan:
    moved.append(f"pyspark {plan['pyspark']} would be installed over the runtime's Spark")
if moved:
    print(f"{name} (Python {pyver}): FAIL: the plan changes the runtime's " + ", ".join(moved))
    sys.exit(1)
upgraded = {norm(u.split("==")[0]) for u in upgrade.split()}
kept = sorted(n for n in plan if n in pins)
# sparkdl's own requirements the runtime does not pin (what the recipe adds for sparkdl;
# the rest of the plan is their dependencies and those the runtime has unpinned here).
direct = {norm(re.match(r"[A-Za-z0-9_.-]+", r).group()) for r in open(reqs) if r.strip()}
added = sorted(n for n in plan if n in direct and n not in pins and n not in upgraded)
main = ("tensorflow", "keras", "numpy", "pandas", "pyarrow")
print(f"{name} (Python {pyver}): ok in {secs}s; keeps {len(kept)} pinned "
      f"({', '.join(f'{n} {plan[n]}' for n in main if n in kept)}); "
      f"upgrades: {upgrade or 'none'}; adds {', '.join(f'{n} {plan[n]}' for n in added)} "
      f"(+{len(plan) - len(kept) - len(upgraded) - len(added)} dependencies)")
PY
done
exit "$failed"
