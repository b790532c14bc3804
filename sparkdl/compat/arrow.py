"""pyarrow as this Python can import it, or an error that names the pip line that fixes it.

pyarrow declares no numpy requirement, so pip resolves the newest pyarrow beside any
numpy: with numpy 1.x (what TensorFlow 2.16 and 2.17 require) it installs pyarrow 26,
which needs numpy 2 and fails at its import. PySpark then reports that pyarrow "was not
found" at the first job. :func:`require_pyarrow` runs as :mod:`sparkdl.model` loads
(``from sparkdl import KerasEstimator`` or ``KerasModel``), and turns that into a
:class:`~sparkdl.errors.ConfigError` naming both versions and the fix.

Example:
    >>> require_pyarrow().__name__
    'pyarrow'
"""

from __future__ import annotations

import functools
import importlib
import re
from importlib import metadata
from types import ModuleType

from sparkdl.errors import ConfigError

__all__ = ["require_pyarrow"]

#: pyarrow 26's own words when numpy is 1.x.
_NEEDS_NUMPY2 = re.compile(r"requires numpy 2", re.IGNORECASE)
#: A reason that blames the numpy package.
_NUMPY = re.compile(r"\bnumpy\b", re.IGNORECASE)
#: What :func:`_version` says of a package that is not installed.
_MISSING = "(not installed)"
#: The first pyarrow that needs numpy 2 (apache/arrow#48473).
NUMPY2_PYARROW = 26


@functools.cache
def require_pyarrow() -> ModuleType:
    """``pyarrow``, imported.

    Raises:
        ConfigError: pyarrow cannot be imported next to this numpy; the message says
            which ``pip install`` fixes it.
    """
    try:
        return importlib.import_module("pyarrow")
    except ImportError as exc:
        reason = str(exc)
        versions = _version("pyarrow"), _version("numpy")
        raise ConfigError(arrow_numpy_mismatch(reason, *versions)) from exc


def arrow_numpy_mismatch(reason: str, pyarrow: str, numpy: str) -> str:
    """The message for pyarrow ``pyarrow`` that failed to import next to numpy ``numpy``
    with ``reason``.

    Example:
        >>> reason = "pyarrow requires NumPy 2.0 or newer, found 1.26.4"
        >>> message = arrow_numpy_mismatch(reason, "26.0.1", "1.26.4")
        >>> message.splitlines()[0]
        'pyarrow 26.0.1 cannot be imported: pyarrow requires NumPy 2.0 or newer, found 1.26.4.'
        >>> 'pip install "pyarrow>=10.0.1,<26"' in message
        True
        >>> old = arrow_numpy_mismatch("numpy.core.multiarray failed to import", "14.0.2", "2.1.0")
        >>> old.splitlines()[1][:60]
        'This Python has numpy 2.1.0; pyarrow before 16 was built for'
        >>> 'pip install "pyarrow>=16"' in old
        True
        >>> other = arrow_numpy_mismatch("numpy.core.multiarray failed", "17.0.0", "2.0.0")
        >>> other.splitlines()[1]
        'Reinstall it: pip install --force-reinstall "pyarrow>=10.0.1".'
    """
    message = f"pyarrow {pyarrow} cannot be imported: {reason}."
    major = _major(pyarrow)
    numpy_2 = _major(numpy) >= 2
    if _NEEDS_NUMPY2.search(reason) or (_NUMPY.search(reason) and major >= NUMPY2_PYARROW):
        message += (
            f"\npyarrow {NUMPY2_PYARROW} and later need numpy 2, and this Python has numpy "
            f"{numpy}. Keep numpy 1.x (TensorFlow 2.16 and 2.17 need it) with pip install "
            f'"pyarrow>=10.0.1,<{NUMPY2_PYARROW}", or move to numpy 2 (with TensorFlow 2.18 '
            "or later)."
        )
    elif _NUMPY.search(reason) and numpy_2 and 0 <= major < 16:
        message += (
            f"\nThis Python has numpy {numpy}; pyarrow before 16 was built for numpy 1.x. "
            'Upgrade it: pip install "pyarrow>=16".'
        )
    elif _NUMPY.search(reason) and numpy == _MISSING:
        message += '\nnumpy is not installed: pip install "numpy>=1.26,<3".'
    else:
        message += '\nReinstall it: pip install --force-reinstall "pyarrow>=10.0.1".'
    return message


def _major(version: str) -> int:
    """A version's major number; -1 when it has none (not installed)."""
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else -1


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return _MISSING
