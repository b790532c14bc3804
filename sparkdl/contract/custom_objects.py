"""Every custom object a model names, found on the driver and shipped to the executors.

Keras rebuilds a model from its config by looking each class and function up by the
name it was saved under: a registered object (``@keras.saving.register_keras_serializable
(package="mylib")``) under ``"mylib>MyLayer"``, an unregistered class under its class
name, an unregistered function under its ``__name__``. An executor has neither the
notebook's or driver script's registrations nor its ``__main__``, and often not the
driver's own modules either, so a model with a custom layer, loss, metric, activation
or initializer failed there with "Could not locate class 'MyLayer'", even when the user
passed ``custom_objects={"MyLayer": MyLayer}`` (the lookup used the registered name).

:func:`collect` walks the live model on the driver (its layers and their attributes, the
arguments of ``compile``, the optimizer and its learning-rate schedule) and keeps each
object whose lookup name the saved config uses; objects the user passed are kept under
their own key and under their registered name; names only Keras's registry knows are
taken from it. :func:`dumps` pickles them with cloudpickle, by value for the user's own
modules (``__main__``, and every imported module whose file is outside
``site-packages`` and the standard library: modules the executors may not have, and
what the objects' code imports from them), by reference for installed packages.

Example:
    >>> collect(None, {"f": len})
    {'f': <built-in function len>}
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import sys
import sysconfig
import threading
import types
from collections.abc import Iterator
from typing import Any

import cloudpickle

from sparkdl.compat.keras import compile_arguments, flatten_layers, raw_learning_rate

__all__ = ["collect", "dumps", "dumps_for_saving", "for_saving"]

_log = logging.getLogger(__name__)
_REGISTRY_LOCK = threading.Lock()
#: Modules whose objects Keras finds without help (its own, and what it builds on).
_KNOWN_PACKAGES = ("keras", "tensorflow", "tf_keras", "builtins", "numpy", "jax", "torch")
#: How deep :func:`_live_objects` follows attributes from a layer or compile argument.
_ATTRIBUTE_DEPTH = 3


def collect(model: Any, given: dict[str, Any] | None = None) -> dict[str, Any]:
    """The custom objects ``model`` needs to be rebuilt where its code is not defined.

    Args:
        model: A Keras model (``None``: only ``given``).
        given: The user's ``custom_objects``, by plain or registered name.

    Returns:
        ``given``, each object also under its registered name, plus every custom class
        or function the model's config names, under the name Keras looks it up by.
    """
    found: dict[str, Any] = dict(given or {})
    if model is None:
        return found
    import keras

    for obj in list(found.values()):
        name = _lookup_name(obj)
        if name is not None:
            found.setdefault(name, obj)  # the registered name Keras looks up
    wanted = _names_in_config(model)
    for obj in _live_objects(model):
        name = _lookup_name(obj)
        if name is not None and name in wanted:
            found.setdefault(name, _target(obj))  # the class, never an instance
    registry = keras.saving.get_custom_objects()
    for name in wanted:
        if name not in found and name in registry:
            found[name] = registry[name]
    return found


def dumps(objects: dict[str, Any] | None) -> bytes | None:
    """``objects`` cloudpickled, the user's own modules by value; ``None`` if empty."""
    if not objects:
        return None
    with _by_value(_own_modules(objects.values())):
        return bytes(cloudpickle.dumps(objects))


def for_saving(pickled: bytes | None) -> bytes | None:
    """What a saved stage keeps of pickled custom objects: all but those registered
    from an importable module. A class or function registered with
    ``@keras.saving.register_keras_serializable`` in a module is found by its
    registered name wherever that module is imported, which is how Keras's own
    ``.keras`` files expect to be loaded; pickling it would make loading run the
    pickle. One registered in ``__main__`` (a script, a notebook) is kept: no import
    in a new process would register it again.

    Example:
        >>> for_saving(None) is None
        True
    """
    if not pickled:
        return None
    objects: dict[str, Any] = cloudpickle.loads(pickled)  # this process's own pickle
    return dumps_for_saving(objects) if objects else None


def dumps_for_saving(objects: dict[str, Any] | None) -> bytes | None:
    """:func:`dumps` of ``objects`` without those registered from an importable
    module (:func:`for_saving`)."""
    kept = {name: obj for name, obj in (objects or {}).items() if not _found_by_name(obj)}
    return dumps(kept)


def _found_by_name(obj: Any) -> bool:
    """Registered with Keras from a module a new process can import."""
    module = str(getattr(_target(obj), "__module__", "") or "")
    return _registered(obj) and module != "__main__"


def _registered(obj: Any) -> bool:
    """Whether Keras's registry holds ``obj`` (its class or function) by its name."""
    import keras

    target = _target(obj)
    try:
        name = keras.saving.get_registered_name(target)
        return bool(name) and keras.saving.get_registered_object(name) is target
    except Exception:
        return False


# ---------------------------------------------------------------------- helpers
def _target(obj: Any) -> Any:
    """``obj`` if it is a class or function, else its class."""
    return obj if isinstance(obj, (type, types.FunctionType)) else type(obj)


def _lookup_name(obj: Any) -> str | None:
    """The name Keras looks ``obj`` up by, for a custom class or function (else None)."""
    import keras

    target = _target(obj)
    if not _is_custom(target):
        return None
    try:
        return str(keras.saving.get_registered_name(target))
    except Exception:  # an object Keras cannot name is not in a config
        return None


def _is_custom(target: Any) -> bool:
    module = str(getattr(target, "__module__", "") or "")
    if isinstance(target, types.ModuleType):
        module = target.__name__
    return bool(module) and module.split(".")[0] not in _KNOWN_PACKAGES


def _names_in_config(model: Any) -> set[str]:
    """Every name the model's saved config (architecture and compile) looks up."""
    import keras

    names: set[str] = set()
    configs: list[Any] = [keras.saving.serialize_keras_object(model)]
    with contextlib.suppress(Exception):  # an uncompiled model has no compile config
        configs.append(model.get_compile_config())
    stack = configs
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("class_name") == "function" and isinstance(item.get("config"), str):
                names.add(item["config"])
            for key in ("registered_name", "class_name"):
                if isinstance(item.get(key), str):
                    names.add(item[key])
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return names


def _live_objects(model: Any) -> Iterator[Any]:
    """The model's layers, what they hold, and what ``compile`` was given."""
    seen: set[int] = set()
    roots: list[Any] = flatten_layers(model)
    roots.append(compile_arguments(model))
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        roots.extend([optimizer, raw_learning_rate(optimizer)])
    stack = [(root, 0) for root in roots]
    while stack:
        obj, depth = stack.pop()
        if obj is None or id(obj) in seen or depth > _ATTRIBUTE_DEPTH:
            continue
        seen.add(id(obj))
        if isinstance(obj, dict):  # containers cost no depth: only object attributes do
            stack.extend((value, depth) for value in obj.values())
            continue
        if isinstance(obj, (list, tuple)):
            stack.extend((value, depth) for value in obj)
            continue
        if isinstance(obj, (str, bytes, int, float, bool)):
            continue
        yield obj
        if isinstance(obj, types.FunctionType) or inspect.isclass(obj):
            continue
        attributes = getattr(obj, "__dict__", None)
        if isinstance(attributes, dict):
            stack.extend((value, depth + 1) for value in attributes.values())


def _own_modules(objects: Any) -> list[types.ModuleType]:
    """The user's own modules (files outside the installed packages and the standard
    library), when ``objects`` has any: what their code imports from them travels too."""
    if not objects:
        return []
    installed = {
        os.path.realpath(path)
        for key in ("purelib", "platlib", "stdlib", "platstdlib")
        if (path := sysconfig.get_paths().get(key))
    }
    modules = []
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if module is None or not file or name == "__main__" or not _is_custom(module):
            continue
        if name.split(".")[0] == "sparkdl":
            continue  # installed wherever sparkdl runs
        path = os.path.realpath(str(file))
        parts = path.split(os.sep)
        if any(path.startswith(root + os.sep) for root in installed):
            continue
        if "site-packages" in parts or "dist-packages" in parts:
            continue
        modules.append(module)
    return modules


@contextlib.contextmanager
def _by_value(modules: list[types.ModuleType]) -> Iterator[None]:
    """cloudpickle pickles ``modules``' objects by value while inside."""
    added = []
    with _REGISTRY_LOCK:  # cloudpickle's registry is the process's: one fit at a time
        registered = cloudpickle.list_registry_pickle_by_value()
        for module in modules:
            if module.__name__ in registered:
                continue  # the user's own registration stays
            try:
                cloudpickle.register_pickle_by_value(module)
                added.append(module)
            except ValueError:  # no longer in sys.modules
                continue
        try:
            yield
        finally:
            for module in added:
                with contextlib.suppress(ValueError):
                    cloudpickle.unregister_pickle_by_value(module)
