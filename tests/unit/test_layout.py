"""The package's shape, checked as rules: tiers and the way imports run between them,
no import cycle (type-level imports included), small functions and classes, and the
seams that keep topology and the Keras backend out of the code that uses them.

The tiers, from the user's side down (a module may import its own tier and those its
rule names; ``sparkdl/__init__.py`` loads its names lazily and is left out):

* the public face: ``sparkdl.estimator``, ``sparkdl.model``, ``sparkdl.requirements``,
  ``sparkdl.__main__``, :mod:`sparkdl.tools` (the command line) and
  :mod:`sparkdl.search` (hyper-parameter search);
* :mod:`sparkdl.ml`: Params, persistence, scoring and evaluation jobs;
* :mod:`sparkdl.driver`: the fit's orchestration and its followers;
* :mod:`sparkdl.server.web` (HTTP) over :mod:`sparkdl.server.state` (training state);
* :mod:`sparkdl.executor`: the tasks' side (it may host the service, never the driver);
* :mod:`sparkdl.contract`: what crosses from the driver to the tasks;
* ``sparkdl.config`` (the settings), :mod:`sparkdl.protocol` (wire and client),
  :mod:`sparkdl.sync` (shared arithmetic), :mod:`sparkdl.compat`, ``sparkdl.errors``
  and ``sparkdl.optimizers`` at the bottom.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "sparkdl"

FACE = "face"
#: What each tier may import besides itself.
RULES: dict[str, set[str]] = {
    FACE: {
        "ml",
        "driver",
        "contract",
        "config",
        "protocol",
        "sync",
        "compat",
        "errors",
        "optimizers",
        "server.state",
    },
    "ml": {"driver", "contract", "config", "protocol", "sync", "compat", "errors", "optimizers"},
    "driver": {
        "server.web",
        "server.state",
        "contract",
        "config",
        "protocol",
        "sync",
        "compat",
        "errors",
        "optimizers",
    },
    "server.web": {"server.state", "contract", "protocol", "sync", "compat", "errors"},
    "server.state": {"contract", "protocol", "sync", "compat", "errors"},
    "executor": {
        "server.web",
        "server.state",
        "contract",
        "protocol",
        "sync",
        "compat",
        "errors",
        "optimizers",
    },
    "contract": {"config", "protocol", "sync", "compat", "errors", "optimizers"},
    "config": {"protocol", "sync", "errors"},
    "protocol": {"sync", "compat", "errors"},
    "sync": {"errors"},
    "compat": {"errors"},
    "errors": set(),
    "optimizers": set(),
}


def tier(module: str) -> str | None:
    """The tier of a dotted module name of sparkdl (``None`` for the package itself)."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    if parts[1] in {"estimator", "model", "requirements", "__main__", "tools", "search"}:
        return FACE
    if parts[1] == "server":
        return ".".join(parts[1:3]) if len(parts) > 2 else None
    return parts[1]


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        found[".".join(rel.parts).removesuffix(".__init__")] = path
    return found


def import_graph(type_level: bool = True) -> dict[str, set[str]]:
    """Every import between sparkdl's modules, at the top or inside a function, those
    under ``TYPE_CHECKING`` included when ``type_level``; a module imports its packages."""
    paths = modules()
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text())
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        hidden = set()
        if not type_level:
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
            for end in range(1, len(parts) + 1):
                name = ".".join(parts[:end])
                if name in paths and name != module and not module.startswith(name + "."):
                    edges.add(name)
        graph[module] = edges
    return graph


def test_imports_run_one_way_between_tiers() -> None:
    wrong = []
    for module, targets in import_graph().items():
        source = tier(module)
        if source is None:
            continue
        assert source in RULES, f"{module}: no tier rule for {source!r}"
        for target in targets:
            to = tier(target)
            if to is None or to == source:
                continue
            if to not in RULES[source]:
                wrong.append(f"{module} ({source}) -> {target} ({to})")
    assert not wrong, "\n".join(sorted(wrong))


#: The only imports by string across the tiers' rule: a contract task entry names the
#: executor module its task runs, so that the driver, which ships the entry, never
#: imports the executor side.
STRING_ENTRIES = {
    ("sparkdl.contract.payload", "sparkdl.executor.task"),
    ("sparkdl.contract.payload", "sparkdl.executor.scoring"),
    ("sparkdl.contract.poll_task", "sparkdl.executor.relay_poll"),
    ("sparkdl.contract.warmup_task", "sparkdl.executor.warmup"),
}
#: Where a module is imported by a name computed at run time: the package's lazy
#: names, the executor's import of its training module, the command line's commands.
COMPUTED_IMPORTS = {"sparkdl", "sparkdl.executor.imports", "sparkdl.tools.cli"}


def string_imports() -> tuple[set[tuple[str, str]], set[str]]:
    """Every ``importlib.import_module(...)`` and ``__import__(...)`` in sparkdl:
    ``(module, target)`` of those naming a sparkdl module by a literal, and the
    modules where one names it by a computed value."""
    literal: set[tuple[str, str]] = set()
    computed: set[str] = set()
    for module, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name not in {"import_module", "__import__"}:
                continue
            target = node.args[0]
            if isinstance(target, ast.Constant) and isinstance(target.value, str):
                if target.value.split(".")[0] == "sparkdl":
                    literal.add((module, target.value))
            else:
                computed.add(module)
    return literal, computed


def test_string_imports_keep_the_tiers_rule() -> None:
    """An import by string is an import: it keeps the tiers' rule, but for the contract's
    task entries, which name the executor module their task runs."""
    literal, computed = string_imports()
    wrong = []
    for module, target in sorted(literal):
        source, to = tier(module), tier(target)
        if source is None or to is None or to == source or (module, target) in STRING_ENTRIES:
            continue
        if to not in RULES[source]:
            wrong.append(f"{module} ({source}) -> {target} ({to}), by string")
    assert not wrong, "\n".join(wrong)
    assert literal >= STRING_ENTRIES, sorted(STRING_ENTRIES - literal)  # no stale entry
    assert computed <= COMPUTED_IMPORTS, sorted(computed - COMPUTED_IMPORTS)


def test_no_import_cycle_type_level_imports_included() -> None:
    graph = import_graph()
    seen: dict[str, int] = {}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(graph[node]):
            if seen.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt])
            elif nxt not in seen:
                visit(nxt, [*path, nxt])
        seen[node] = 2

    for root in sorted(graph):
        if root not in seen:
            visit(root, [root])
    assert not cycles, cycles


def test_at_most_eight_modules_at_the_top() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 8, top


def _code_lines(node: ast.AST, source: list[str]) -> int:
    """Lines holding code in ``node``: no blank line, comment or docstring."""
    docstrings = set()
    for inner in ast.walk(node):
        body = getattr(inner, "body", None)
        if (
            isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    count = 0
    for number in range(node.lineno, node.end_lineno + 1):
        text = source[number - 1].strip()
        if text and not text.startswith("#") and number not in docstrings:
            count += 1
    return count


def test_no_function_over_60_code_lines_and_no_class_over_250() -> None:
    long = []
    for module, path in modules().items():
        text = path.read_text()
        source = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size, limit = _code_lines(node, source), 60
            elif isinstance(node, ast.ClassDef):
                size, limit = _code_lines(node, source), 250
            else:
                continue
            if size > limit:
                long.append(f"{module}:{node.lineno} {node.name}: {size} > {limit}")
    assert not long, "\n".join(long)


#: The variants of where the service lives; only their factories may tell them apart.
TOPOLOGY = {
    "WeightStore",
    "ShardedStore",
    "Relay",
    "ServiceClient",
    "ShardedClient",
    "Pusher",
    "ShardedPusher",
    "HostedService",
    "DriverService",
    "ShardedService",
}
#: Where those variants are built.
FACTORIES = {"sparkdl.driver.service", "sparkdl.executor.channel"}


def test_no_isinstance_on_topology_outside_its_factories() -> None:
    found = []
    for module, path in modules().items():
        if module in FACTORIES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "isinstance"
                and len(node.args) == 2
            ):
                names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                names |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
                if names & TOPOLOGY:
                    found.append(f"{module}:{node.lineno} {ast.unparse(node)}")
    assert not found, "\n".join(found)


BACKENDS = re.compile(r"""^(?:tensorflow|jax|torch|numpy)$""")
#: Where a backend's name may be compared: the backends themselves and the plan.
BACKEND_SEAM = ("sparkdl.executor.backends", "sparkdl.contract.backends", "sparkdl.contract.plan")


def test_no_backend_name_comparison_outside_the_backends_and_the_plan() -> None:
    found = []
    for module, path in modules().items():
        if module.startswith(BACKEND_SEAM):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            for side in sides:
                values = [side] if isinstance(side, ast.Constant) else []
                if isinstance(side, (ast.Tuple, ast.Set, ast.List)):
                    values = list(side.elts)
                if any(
                    isinstance(v, ast.Constant)
                    and isinstance(v.value, str)
                    and BACKENDS.match(v.value)
                    and not any(
                        isinstance(op, (ast.In, ast.NotIn))
                        for op in node.ops
                        if "modules" in ast.unparse(node)
                    )
                    for v in values
                ):
                    found.append(f"{module}:{node.lineno} {ast.unparse(node)}")
    assert not found, "\n".join(found)
