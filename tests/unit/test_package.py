"""``import sparkdl`` stays light: its public names load at first use; the executor side
imports no driver module.

A Spark worker that unpickles the warm-up's task function
(:mod:`sparkdl.contract.warmup_task`) imports the package; it must not load the estimator
and ``pyspark.ml`` before it starts importing TensorFlow. A training task unpickles the
payload and imports the task entry: imports run driver -> payload <- executor, never
executor -> driver. The relay's poll tasks and the warm-up's tasks alike.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import cloudpickle

from tests.unit.test_layout import import_graph

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
    "sparkdl.driver.callbacks",
    "sparkdl.server.state.checkpoints",
    "sparkdl.tools.cli",
    "sparkdl.driver.cluster",
    "sparkdl.config",
    "sparkdl.driver.data",
    "sparkdl.driver.data_scan",
    "sparkdl.estimator",
    "sparkdl.ml.evaluation",
    "sparkdl.driver.fit",
    "sparkdl.driver.followers",
    "sparkdl.driver.driver_service",
    "sparkdl.driver.hosted_service",
    "sparkdl.driver.interrupt",
    "sparkdl.driver.launcher",
    "sparkdl.driver.service",
    "sparkdl.contract.keras_io",
    "sparkdl.model",
    "sparkdl.ml.params",
    "sparkdl.ml.persistence",
    "sparkdl.ml.predict",
    "sparkdl.driver.progress",
    "sparkdl.driver.relay",
    "sparkdl.server.web.app",
    "sparkdl.server.web.parse",
    "sparkdl.server.state.policies",
    "sparkdl.server.web.service",
    "sparkdl.server.state.training",
    "sparkdl.server.state.store",
    "sparkdl.driver.spark_ui",
    "sparkdl.driver.tracking",
    "sparkdl.driver.warmup",
]

#: Run in a fresh interpreter: unpickle a task's function, import its executor module,
#: and find no driver module, no ``pyspark.ml`` and no Keras loaded.
UNPICKLE = """
import importlib, sys
import cloudpickle
function = cloudpickle.loads(bytes.fromhex(sys.argv[1]))
importlib.import_module(sys.argv[2])
loaded = sorted(m for m in sys.modules if m.startswith(("sparkdl", "pyspark.ml", "keras")))
driver = set(sys.argv[3].split(","))
assert not [m for m in loaded if m in driver or m.startswith(("pyspark.ml", "keras"))], loaded
"""


def test_the_task_entry_and_its_payload_import_no_driver_module() -> None:
    from sparkdl.config import TrainConfig
    from sparkdl.contract.payload import WorkerPayload, train_function
    from sparkdl.contract.plan import FitPlan

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
    _check_fresh_task(train_function(payload), "sparkdl.executor.task")


def test_the_scoring_tasks_import_no_driver_module() -> None:
    """transform's and evaluate's tasks: their functions and the scoring module."""
    from sparkdl.contract.payload import ScoringPayload, evaluate_function, predict_function

    scoring = ScoringPayload(b"", "digest", None, [(3,)], [False], [""], 8, outputs=[("y", True)])
    _check_fresh_task(predict_function(scoring), "sparkdl.executor.scoring")
    _check_fresh_task(evaluate_function(scoring), "sparkdl.executor.scoring")


def test_the_relay_poll_task_imports_no_driver_module() -> None:
    """The relay's poll task (``service_placement="cluster"``): its function and module."""
    from sparkdl.contract.poll_task import poll_function

    request = {"fit_id": "f", "token": "t", "timeout": 1, "query": {}, "fetched": None}
    _check_fresh_task(poll_function(request), "sparkdl.executor.relay_poll")


def test_the_warm_up_task_imports_no_driver_module() -> None:
    """The warm-up's task: its function and the worker's side of the warm-up."""
    from sparkdl.contract.tf_logs import TensorFlowLogs
    from sparkdl.contract.warmup_task import warm_function

    warm = warm_function(TensorFlowLogs(), "tensorflow", "sparkdl.executor.training", block=True)
    _check_fresh_task(warm, "sparkdl.executor.warmup")


def _check_fresh_task(function: object, module: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            UNPICKLE,
            cloudpickle.dumps(function).hex(),
            module,
            ",".join(DRIVER),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_sparkdl_has_no_import_cycle() -> None:
    """Every import between sparkdl's modules, at the top or inside a function (not
    under ``TYPE_CHECKING``), with a package's ``__init__`` counted: no cycle. (The
    payload's task functions name their executor modules by string, on purpose, so
    that the driver never imports them: that edge runs only on the executors.)"""
    graph = import_graph(type_level=False)
    cycles = [c for c in _strongly_connected(graph) if len(c) > 1]
    assert not cycles, cycles


def test_the_sync_protocol_imports_nothing_of_the_service() -> None:
    """``sync/`` is shared by the driver, the service and the executors."""
    graph = import_graph(type_level=False)
    reach = {m: sorted(t for t in graph[m] if t.startswith("sparkdl.server")) for m in graph}
    assert not {m: t for m, t in reach.items() if m.startswith("sparkdl.sync") and t}


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


# --- dependency internals only in sparkdl/compat/ --------------------------------------

PACKAGE = Path(__file__).resolve().parents[2] / "sparkdl"
COMPAT = PACKAGE / "compat"
#: Top-level modules of the dependencies whose internals may only be used in compat/.
DEPENDENCIES = {
    "cheroot",
    "cloudpickle",
    "cryptography",
    "flask",
    "jax",
    "jaxlib",
    "keras",
    "mlflow",
    "numpy",
    "pandas",
    "py4j",
    "pyarrow",
    "pyspark",
    "tensorflow",
    "tf_keras",
    "werkzeug",
}
#: Packages that are private although their names have no leading underscore.
PRIVATE_PACKAGES = (
    "keras.src",
    "tf_keras.src",
    "tensorflow.python",
    "tensorflow.core",
    "mlflow.utils",
)
#: ``(file relative to sparkdl/, private name)`` left outside compat/ on purpose, and why.
#: ``(file, name)`` of internals used outside compat/ on purpose, with the reason.
KNOWN: dict[tuple[str, str], str] = {}
_SELF = {"self", "cls"}
_ATTRIBUTE_FUNCTIONS = {"getattr", "hasattr", "setattr", "delattr"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_module(module: str) -> bool:
    """Whether importing ``module`` reaches a dependency's (or CPython's) internals."""
    parts = module.split(".")
    if parts[0] != "__future__" and parts[0].startswith("_"):
        return True  # _imp, _pyio, _thread...: the interpreter's own internals
    if parts[0] not in DEPENDENCIES:
        return False
    return any(p.startswith("_") for p in parts) or module.startswith(
        tuple(f"{p}." for p in PRIVATE_PACKAGES) + PRIVATE_PACKAGES
    )


def _own_private_names(trees: list[ast.AST]) -> set[str]:
    """Private names sparkdl itself defines (functions, classes, module / class
    attributes, ``self._x`` / ``cls._x``): reading those is not reaching into a
    dependency."""
    own: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        own.add(leaf.id)
                    elif (
                        isinstance(leaf, ast.Attribute)
                        and isinstance(leaf.value, ast.Name)
                        and leaf.value.id in _SELF
                    ):
                        own.add(leaf.attr)
    return {name for name in own if _private(name)}


def _root(node: ast.expr) -> str | None:
    """The name an attribute chain starts from (``a`` in ``a.b().c[0].d``)."""
    while True:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        else:
            return None


def _is_sys_modules(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "modules"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def dependency_internals(tree: ast.AST, own: set[str]) -> list[tuple[int, str, str]]:
    """``(line, private name, what)`` for each use of a dependency's internals in
    ``tree``: a private module or name imported from a dependency, a private attribute
    of a dependency's module (or of anything reached from it), a private attribute
    sparkdl does not define (by ``.`` or ``getattr``), a write to ``sys.modules``."""
    found: list[tuple[int, str, str]] = []
    imported: set[str] = set()  # names bound to a dependency's modules or objects here
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _private_module(alias.name):
                    found.append((node.lineno, alias.name, "private module import"))
                if alias.name.split(".")[0] in DEPENDENCIES:
                    imported.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _private_module(node.module):
                found.append((node.lineno, node.module, "private module import"))
            if node.module.split(".")[0] in DEPENDENCIES:
                for alias in node.names:
                    if _private(alias.name):
                        found.append((node.lineno, alias.name, f"private name of {node.module}"))
                    imported.add(alias.asname or alias.name)
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
            func = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            arg = node.args[0] if node.args else None
            text = arg.value if isinstance(arg, ast.Constant) else None
            if func in {"import_module", "__import__"} and _private_module(str(text or "")):
                found.append((node.lineno, text, "private module import"))
            if func in _ATTRIBUTE_FUNCTIONS and len(node.args) >= 2:
                name = node.args[1]
                if (
                    isinstance(name, ast.Constant)
                    and isinstance(name.value, str)
                    and _private(name.value)
                    and name.value not in own
                ):
                    found.append((node.lineno, name.value, f"{func}() of a private attribute"))
            if (
                isinstance(node.func, ast.Attribute)
                and _is_sys_modules(node.func.value)
                and node.func.attr in {"pop", "setdefault", "update", "clear", "popitem"}
            ):
                found.append((node.lineno, "sys.modules", f"sys.modules.{node.func.attr}()"))
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                if isinstance(target, ast.Subscript) and _is_sys_modules(target.value):
                    found.append((node.lineno, "sys.modules", "sys.modules changed"))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not _private(node.attr):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in _SELF:
            continue  # sparkdl's own, or the protected API of a base class it extends
        root = _root(node.value)
        if root in imported:
            found.append((node.lineno, node.attr, f"private attribute reached from {root}"))
        elif node.attr not in own:
            found.append((node.lineno, node.attr, "private attribute sparkdl does not define"))
    return sorted(set(found))


def _sources() -> dict[str, ast.AST]:
    return {
        str(path.relative_to(PACKAGE)): ast.parse(path.read_text(), str(path))
        for path in sorted(PACKAGE.rglob("*.py"))
        if COMPAT not in path.parents
    }


def test_dependency_internals_are_reached_only_in_compat() -> None:
    sources = _sources()
    own = _own_private_names(list(sources.values()))
    found = {
        (file, line, name, what)
        for file, tree in sources.items()
        for line, name, what in dependency_internals(tree, own)
    }
    new = sorted(f for f in found if (f[0], f[2]) not in KNOWN)
    assert not new, (
        "A dependency's internals are used outside sparkdl/compat/. Move each into a small "
        "function of sparkdl/compat/<dependency>.py (docstring: the internal, why no "
        "public API does, the fallback) with a shape test in tests/unit/"
        "test_compat_shapes.py. Found:\n"
        + "\n".join(f"  sparkdl/{f}:{line}: {name} ({what})" for f, line, name, what in new)
    )
    stale = sorted(k for k in KNOWN if not any((f[0], f[2]) == k for f in found))
    assert not stale, f"KNOWN lists internals that are gone, drop them: {stale}"


def test_the_internals_guard_sees_what_it_must_and_nothing_else() -> None:
    code = """
import _imp
import sys
from keras.src.saving import serialization_lib
from pyspark.sql.pandas.types import _create_converter
import tensorflow.python.eager.context as context
import tensorflow as tf
from pyspark.ml.param import Params

class Mine:
    def __init__(self, model, sc, conn, rfile):
        self._ok = 1
        self._helper()
        other = Mine()
        other._ok                                   # sparkdl's own, defined above
        model._flatten_layers()                     # 1
        sc._jsc.sc()                                # 2
        getattr(conn, "_tls_ready", True)           # 3
        getattr(conn, "_ok", None)                  # sparkdl's own
        tf.config._private                          # 4
        Params._dummy()                             # 5
        context.context()._context_handle           # 6
        sys.modules["sklearn"] = None               # 7
        del sys.modules["sklearn"]                  # 8
        sys.modules.pop("sklearn")                  # 9
        "x" in sys.modules and sys.modules.get("x") # reading is fine
        rfile.__dict__, type(model).__name__        # dunders are fine

    def _helper(self):
        pass
"""
    tree = ast.parse(code)
    found = dependency_internals(tree, _own_private_names([tree]))
    names = [name for _, name, _ in found]
    assert names.count("_imp") == 1
    assert "keras.src.saving" in names and "tensorflow.python.eager.context" in names
    assert "_create_converter" in names
    for name in ["_flatten_layers", "_jsc", "_tls_ready", "_private", "_dummy", "_context_handle"]:
        assert name in names, (name, found)
    assert names.count("sys.modules") == 3
    assert "_ok" not in names and "_helper" not in names
    assert len(found) == 13, found
