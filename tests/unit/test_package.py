"""``import sparkdl`` stays light: its public names load at first use; the executor side
imports no driver module.

A Spark worker that unpickles a function of :mod:`sparkdl.warmup` imports the package;
it must not load the estimator and ``pyspark.ml`` before it starts importing TensorFlow.
A training task unpickles the payload and imports the task entry: imports run driver ->
payload <- executor, never executor -> driver.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import cloudpickle

CHECK = """
import sys
import sparkdl
loaded = sorted(m for m in sys.modules if m.startswith(("sparkdl.", "pyspark.ml", "keras")))
assert loaded == ["sparkdl.errors"], loaded
from sparkdl import KerasEstimator, KerasModel, LARS, TrainConfig, loading_options, warm_up
assert KerasEstimator.__module__ == "sparkdl.estimator" and sparkdl.KerasModel is KerasModel
assert set(sparkdl.__all__) <= set(dir(sparkdl))
try:
    sparkdl.no_such_name
except AttributeError as exc:
    assert "no_such_name" in str(exc)
else:
    raise AssertionError("an unknown name must raise AttributeError")
"""


def test_import_sparkdl_loads_only_its_errors_until_a_name_is_used() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]


#: Modules of the driver side: none may load in a training task before it trains.
DRIVER = [
    "sparkdl.callbacks",
    "sparkdl.checkpoints",
    "sparkdl.cli",
    "sparkdl.cluster",
    "sparkdl.config",
    "sparkdl.data",
    "sparkdl.estimator",
    "sparkdl.evaluation",
    "sparkdl.fit",
    "sparkdl.interrupt",
    "sparkdl.keras_io",
    "sparkdl.model",
    "sparkdl.params",
    "sparkdl.persistence",
    "sparkdl.predict",
    "sparkdl.progress",
    "sparkdl.server.app",
    "sparkdl.server.service",
    "sparkdl.server.store",
    "sparkdl.spark_ui",
    "sparkdl.tracking",
]

TASK = """
import sys
import cloudpickle
train = cloudpickle.loads(bytes.fromhex(sys.argv[1]))
import sparkdl.executor.task
loaded = sorted(m for m in sys.modules if m.startswith(("sparkdl", "pyspark.ml", "keras")))
driver = set(sys.argv[2].split(","))
assert not [m for m in loaded if m in driver or m.startswith(("pyspark.ml", "keras"))], loaded
"""


def test_the_task_entry_and_its_payload_import_no_driver_module() -> None:
    from sparkdl.config import TrainConfig
    from sparkdl.payload import WorkerPayload, train_function
    from sparkdl.plan import FitPlan

    plan = FitPlan.resolve(
        TrainConfig(), num_workers=2, rows=100, threads=1, service_host="127.0.0.1"
    )
    payload = WorkerPayload(
        plan=plan,
        url="http://127.0.0.1:1",
        token="t",
        model_bytes=b"",
        custom_objects=None,
        input_shapes=[(3,)],
        label_kinds=["int"],
    )
    pickled = cloudpickle.dumps(train_function(payload)).hex()
    done = subprocess.run(
        [sys.executable, "-c", TASK, pickled, ",".join(DRIVER)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_sparkdl_has_no_import_cycle() -> None:
    """Every import between sparkdl's modules, at the top or inside a function (not
    under ``TYPE_CHECKING``), with a package's ``__init__`` counted: no cycle."""
    graph = _import_graph()
    cycles = [c for c in _strongly_connected(graph) if len(c) > 1]
    assert not cycles, cycles


def test_the_sync_protocol_imports_nothing_of_the_service() -> None:
    """``sync/`` is shared by the driver, the service and the executors."""
    graph = _import_graph()
    reach = {m: sorted(t for t in graph[m] if t.startswith("sparkdl.server")) for m in graph}
    assert not {m: t for m, t in reach.items() if m.startswith("sparkdl.sync") and t}


def _import_graph() -> dict[str, set[str]]:
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "sparkdl")
    paths: dict[str, str] = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, os.path.dirname(root))[:-3].replace(os.sep, ".")
                paths[rel.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        with open(path) as file:
            tree = ast.parse(file.read())
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        hidden = {
            id(node)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for node in ast.walk(block)
        }
        targets: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in hidden:
                continue
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                targets.update(f"{base}.{a.name}" for a in node.names)
                targets.add(base)
        edges = set()
        for target in targets:
            parts = target.split(".")
            for end in range(1, len(parts) + 1):  # a module imports its packages too
                name = ".".join(parts[:end])
                if name in paths and name != module and not module.startswith(name + "."):
                    edges.add(name)
        graph[module] = edges
    return graph


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        component.append(member)
                        if member == node:
                            break
                    found.append(component)
    return found
