"""Sphinx extension: references to sparkdl's own names must name something that exists.

The build runs nitpicky (``nitpicky = True`` in ``conf.py``) but ignores unresolved
references to other projects (numpy, pyspark, keras: no inventories offline). For a
reference that names sparkdl, by a dotted ``sparkdl.`` path or by a short name that the
docstring's module defines, this extension imports what it names and:

* links it to where the documentation describes that object under another name (a
  reference to ``sparkdl.errors.ConfigError`` links to ``sparkdl.ConfigError``,
  documented in the API reference);
* renders it as code, unlinked, when it exists but is an internal the documentation
  does not describe (a private helper, a type variable, a module of the tiers);
* leaves it unresolved when nothing of that name exists (a module that moved, a class
  that was renamed): the nitpicky build then fails on it, naming the target.

Docstrings the site does not render are checked too: every ``:mod:``, ``:class:``,
``:func:``... role in ``sparkdl/**/*.py`` whose target is a ``sparkdl.`` path must name
something that exists, so a module's move cannot leave a stale reference behind in a
module the reference pages do not show.

``SPARKDL_DOCS_LINK_ALL=1`` also reports the internals rendered as code, to see which
references the site leaves unlinked.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import types
from typing import Any, TypeVar

from docutils import nodes
from sphinx.addnodes import pending_xref
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util import logging

logger = logging.getLogger(__name__)

#: Unresolved references the nitpicky build forgives: every Python target that is not a
#: dotted ``sparkdl.`` path (those this extension has not placed are errors).
NOT_SPARKDL = re.compile(r"(?!sparkdl\.).*")

_MISSING = object()

#: A Python role with a dotted sparkdl target, as docstrings write it.
SOURCE_ROLE = re.compile(
    r":(?:py:)?(?:mod|class|func|meth|attr|data|exc|obj|const):"
    r"`(?:[^`<]*<)?[~.]?(sparkdl(?:\.\w+)+)>?`"
)


def lookup(dotted: str) -> Any:
    """The object a dotted path names (a module, then attributes), or ``_MISSING``."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(module)
        except ImportError:
            if _exists(module):
                # A module that needs an extra this environment lacks (JAX's backend
                # without JAX): it exists; what it holds cannot be checked here.
                return types.ModuleType(dotted)
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name, _MISSING)
            if obj is _MISSING:
                return _MISSING
        return obj
    return _MISSING


def _exists(module: str) -> bool:
    """Whether a module's file is there (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _in_context(node: pending_xref, target: str) -> Any:
    """What a short name means in the docstring's module (or class), else ``_MISSING``."""
    module = node.get("py:module")
    if not module or not module.startswith("sparkdl"):
        return _MISSING
    klass = node.get("py:class")
    for scope in ([f"{module}.{klass}"] if klass else []) + [module]:
        found = lookup(f"{scope}.{target}")
        if found is not _MISSING:
            return found
    return _MISSING


def _owned(obj: Any) -> bool:
    """Whether an object is sparkdl's (defined in one of its modules)."""
    if isinstance(obj, types.ModuleType):
        return obj.__name__.startswith("sparkdl")
    owner = getattr(obj, "__module__", None) or ""
    return isinstance(owner, str) and owner.startswith("sparkdl")


def _documented(env: BuildEnvironment) -> dict[int, tuple[Any, str]]:
    """Documented objects by identity: ``id(obj)`` -> the name the site describes it by."""
    cache = getattr(env, "_sparkdl_documented", None)
    if cache is None:
        cache = {}
        objects = env.get_domain("py").objects  # type: ignore[attr-defined]
        for name, entry in objects.items():
            if getattr(entry, "aliased", False) or not name.startswith("sparkdl"):
                continue
            obj = lookup(name)
            if obj is not _MISSING:
                # Methods reached through different classes are one function: keep the
                # first name (the page's order), which is the class that documents it.
                # The object is kept with its name: an id is unique only while its
                # object lives (a bound method is a new object at every lookup).
                cache.setdefault(id(obj), (obj, name))
        env._sparkdl_documented = cache  # type: ignore[attr-defined]
    return cache


def _forget(app: Sphinx, env: BuildEnvironment, *args: Any) -> None:
    if hasattr(env, "_sparkdl_documented"):
        del env._sparkdl_documented


def missing_reference(
    app: Sphinx, env: BuildEnvironment, node: pending_xref, contnode: nodes.Element
) -> nodes.Element | None:
    """Places a Python reference to a sparkdl object the Python domain did not find."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip("~.")
    obj = lookup(target) if target.startswith("sparkdl.") else _in_context(node, target)
    if obj is _MISSING or not (_owned(obj) or isinstance(obj, TypeVar)):
        return None  # a sparkdl.* target that does not exist fails the nitpicky build
    _, name = _documented(env).get(id(obj), (None, None))
    if name is not None:
        domain = env.get_domain("py")
        return domain.resolve_xref(  # type: ignore[no-any-return]
            env, node["refdoc"], app.builder, "obj", name, node, contnode
        )
    if os.environ.get("SPARKDL_DOCS_LINK_ALL") == "1":
        logger.warning("reference to an undocumented internal: %s", target, location=node)
    return contnode


def check_sources(app: Sphinx, env: BuildEnvironment) -> None:
    """Warns of every role in ``sparkdl/``'s sources whose ``sparkdl.`` target is gone."""
    package = os.path.dirname(os.path.abspath(importlib.import_module("sparkdl").__file__ or ""))
    root = os.path.dirname(package)
    for folder, _, files in os.walk(package):
        for file in sorted(files):
            if not file.endswith(".py"):
                continue
            path = os.path.join(folder, file)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            for match in SOURCE_ROLE.finditer(text):
                if lookup(match.group(1)) is _MISSING:
                    line = text.count("\n", 0, match.start()) + 1
                    logger.warning(
                        "reference to %s, which does not exist (move or rename the "
                        "reference, or write it as ``literal``)",
                        match.group(1),
                        location=f"{os.path.relpath(path, root)}:{line}",
                    )


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("missing-reference", missing_reference)
    app.connect("env-check-consistency", check_sources)
    app.connect("env-updated", lambda app, env: _forget(app, env))
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
