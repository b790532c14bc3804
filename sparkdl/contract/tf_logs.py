"""TensorFlow's C++ log lines: decided once on the driver, kept off the user's terminal.

TensorFlow's native code writes to the process's stderr (file descriptor 2), not
through Python. Two kinds of line reach a terminal:

* Lines filtered by ``TF_CPP_MIN_LOG_LEVEL``: "failed call to cuInit" (ERROR, at the
  first operation of every process without a GPU), ``cpu_feature_guard``'s INFO line.
  Setting the variable before TensorFlow loads hides them.
* Lines its shared libraries print as they load: absl's "All log messages before
  absl::InitializeLog() is called are written to STDERR", ``port.cc``'s "oneDNN custom
  operations are on", ``cudart_stub``'s "Could not find cuda drivers". With TensorFlow
  2.21 they show at every level when the variable is set from Python (they honour it
  only when the process started with it), twice (two copies of absl).

On a ``local[...]`` master Spark's Python workers run under the driver's JVM, and their
stderr is the driver's: a terminal, or a notebook cell (ipykernel forwards file
descriptor 2). There a worker sets the level (3, or 2 when tasks get GPUs, so that
CUDA's real errors show), unless the user set one on the driver, and loads TensorFlow
with its stderr sent through a pipe: the load-time lines the level hides are dropped
(absl's notice counts as a WARNING), anything else is passed on as it comes. A user
who set level 0 sees every line. On a cluster the executors' stderr is their own log
(YARN's container logs, the standalone worker's ``work/`` directory), which keeps every
line: sparkdl only passes on a level the user set on the driver.

:func:`quiet_tensorflow` does the same for the driver's own ``import keras``.

The same variable and the same native logging serve XLA, JAX's compiler, so a JAX
worker loads as this says too (:meth:`sparkdl.executor.backends.base.Backend.load`).

Example:
    >>> TensorFlowLogs.resolve(local=True, gpus=False, environ={})
    TensorFlowLogs(level='3', filtered=True)
    >>> TensorFlowLogs.resolve(local=False, gpus=False, environ={})
    TensorFlowLogs(level=None, filtered=False)
    >>> TensorFlowLogs.resolve(local=True, gpus=False, environ={"TF_CPP_MIN_LOG_LEVEL": "0"})
    TensorFlowLogs(level='0', filtered=False)
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["LEVEL_VARIABLE", "TensorFlowLogs", "is_tensorflow_line", "quiet_tensorflow"]

#: The variable TensorFlow reads its C++ log level from.
LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"

#: A line of absl's log format (severity, date, time, thread, file:line]), its severity
#: in the group; absl's notice before logging starts, a WARNING; the second line of
#: ``cpu_feature_guard``'s INFO message, which has no prefix of its own.
_LINE = re.compile(rb"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.-]+:\d+\]")
_NOTICE = b"WARNING: All log messages before absl::InitializeLog() is called are written to"
_CONTINUED = re.compile(rb"^To enable the following instructions: .* rebuild TensorFlow")
#: ``TF_CPP_MIN_LOG_LEVEL`` -> the severities it hides.
_HIDDEN = {1: b"I", 2: b"IW", 3: b"IWE"}

_T = TypeVar("_T")

#: The level :func:`quiet_tensorflow` put in this process's environment, if it did.
_set_here: str | None = None


@dataclass(frozen=True)
class TensorFlowLogs:
    """How quietly a Python worker loads Keras's backend, resolved on the driver.

    Attributes:
        level: ``TF_CPP_MIN_LOG_LEVEL`` for the worker (:meth:`load` says when an
            executor's own value wins); ``None`` leaves it alone.
        filtered: Load TensorFlow with stderr captured and its load-time lines dropped
            (workers whose stderr is the driver's).
    """

    level: str | None = None
    filtered: bool = False

    @classmethod
    def resolve(
        cls,
        *,
        local: bool,
        gpus: bool,
        environ: Mapping[str, str] | None = None,
    ) -> TensorFlowLogs:
        """What the workers do, from the driver's environment and the master.

        Args:
            local: The master is ``local[...]``: the workers' stderr is the driver's.
            gpus: Tasks get GPUs: CUDA's ERROR lines stay visible (level 2, not 3).
            environ: The driver's environment; ``None`` reads ``os.environ``.

        Returns:
            The user's level when they set one (its load-time lines filtered on a
            local master); else on a local master level 3 (2 with GPUs), filtered;
            else nothing.
        """
        env = os.environ if environ is None else environ
        level = env.get(LEVEL_VARIABLE)
        if level and not (environ is None and level == _set_here):  # the user's level
            return cls(level=level, filtered=local and _level(level) > 0)
        if local:
            return cls(level="2" if gpus else "3", filtered=True)
        return cls()

    def load(self, importer: Callable[[], _T]) -> _T:
        """Runs ``importer`` (an import of TensorFlow or Keras) as this says.

        Sets the level, then, when ``filtered``, runs ``importer`` with stderr filtered
        (:func:`filtered_stderr`). On a cluster (not ``filtered``) a value already in the
        executor's environment (``spark.executorEnv.TF_CPP_MIN_LOG_LEVEL``) wins; a
        local worker takes the driver's decision, whatever its environment inherited
        from the driver's process. The worker is set up for its backend before
        (:meth:`sparkdl.executor.backends.base.Backend.load` calls this).
        """
        if self.level is not None and (self.filtered or LEVEL_VARIABLE not in os.environ):
            os.environ[LEVEL_VARIABLE] = self.level
        self.quiet_python_warnings()
        if not self.filtered or "tensorflow" in sys.modules:
            return importer()
        with filtered_stderr(_level(self.level)):  # filtered: the level set just above
            return importer()

    def quiet_python_warnings(self) -> None:
        """On a worker whose stderr is the driver's terminal (``filtered``) at a level
        that hides warnings (2 or 3), TensorFlow's Python logger gets the same: its
        warnings (``tf.function`` retracing while a model scores, among them) are off
        the terminal too, unless the worker's logger has a level already."""
        if not self.filtered or _level(self.level) < 2:
            return
        logger = logging.getLogger("tensorflow")
        if logger.level == logging.NOTSET:  # not set by the user (nor by TensorFlow)
            logger.setLevel(logging.ERROR)


@contextlib.contextmanager
def quiet_tensorflow() -> Iterator[None]:
    """Keeps TensorFlow's C++ log lines off this process's stderr while it loads.

    Import Keras (or TensorFlow) inside the block: its load-time lines (absl's notice,
    oneDNN, CUDA drivers) are dropped, and ``TF_CPP_MIN_LOG_LEVEL`` is set to 3 unless
    it is set already, which hides TensorFlow's later INFO, WARNING and ERROR lines
    (CUDA's "failed call to cuInit" on a machine without a GPU among them). Anything
    else printed meanwhile reaches stderr as usual. The workers of a ``local[...]``
    master do this by themselves; this is for the driver. The level it sets is not
    taken for the user's: the executors still get the level sparkdl picks for them.

    Example:
        >>> import sparkdl
        >>> with sparkdl.quiet_tensorflow():
        ...     import keras
    """
    global _set_here
    if not os.environ.get(LEVEL_VARIABLE):
        os.environ[LEVEL_VARIABLE] = _set_here = "3"
    with filtered_stderr(_level(os.environ[LEVEL_VARIABLE])):
        yield


def is_tensorflow_line(line: bytes, level: int = 3) -> bool:
    """Whether ``line`` is one TensorFlow's native code logs that ``level``
    (``TF_CPP_MIN_LOG_LEVEL``) hides.

    Example:
        >>> is_tensorflow_line(b"I0000 00:00:1795.123   42 port.cc:153] oneDNN custom ops")
        True
        >>> is_tensorflow_line(b"E0000 00:00:1795.123   42 cuda_platform.cc:52] failed", 2)
        False
        >>> is_tensorflow_line(b"Traceback (most recent call last):")
        False
    """
    hidden = _HIDDEN.get(min(level, 3), b"")
    if line.startswith(_NOTICE):
        return b"W" in hidden
    if _CONTINUED.match(line):
        return b"I" in hidden
    match = _LINE.match(line)
    return match is not None and match.group(1) in hidden


# One capture per process at a time: a nested or concurrent block (the warm-up's import
# thread and a task's) joins the one in place.
_lock = threading.Lock()
_depth = 0
_capture: _Capture | None = None


@contextlib.contextmanager
def filtered_stderr(level: int = 3) -> Iterator[None]:
    """Points file descriptor 2 at a pipe for the block; a thread forwards to the real
    stderr, as they come, the lines :func:`is_tensorflow_line` does not match at
    ``level`` (so a process that dies in the block still shows what it printed).
    Without a usable stderr the block runs unfiltered."""
    if not _begin(level):
        yield
        return
    try:
        yield
    finally:
        _end()


class _Capture:
    """File descriptor 2 redirected into a pipe, and the thread that filters it."""

    def __init__(self, level: int) -> None:
        self.level = level
        self.saved = os.dup(2)
        try:
            self.read_end, write_end = os.pipe()
        except OSError:
            os.close(self.saved)
            raise
        os.dup2(write_end, 2)
        os.close(write_end)  # fd 2 is now the pipe's only write end
        self.thread = threading.Thread(target=self._forward, name="sparkdl-stderr", daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Points fd 2 back at stderr; the pipe then ends and the thread finishes."""
        try:
            os.dup2(self.saved, 2)
        finally:
            self.thread.join(timeout=10)
            os.close(self.saved)

    def _forward(self) -> None:
        pending = b""
        try:
            while chunk := os.read(self.read_end, 65536):
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                self._write(b"".join(line + b"\n" for line in lines if self._kept(line)))
            if pending and self._kept(pending):
                self._write(pending)
        finally:
            os.close(self.read_end)

    def _kept(self, line: bytes) -> bool:
        return not is_tensorflow_line(line, self.level)

    def _write(self, data: bytes) -> None:
        while data:
            try:
                data = data[os.write(self.saved, data) :]
            except OSError:  # stderr is gone: nothing more can be shown
                return


def _begin(level: int) -> bool:
    """Starts (or joins) this process's capture; whether one is in place."""
    global _depth, _capture
    with _lock:
        if _depth == 0:
            with contextlib.suppress(Exception):  # a closed or missing sys.stderr
                if sys.stderr is not None:
                    sys.stderr.flush()
            try:
                _capture = _Capture(level)
            except OSError:  # no fd 2, or no pipe: run unfiltered
                return False
        _depth += 1
        return True


def _end() -> None:
    """Leaves the capture; the last one out points fd 2 back at stderr."""
    global _depth, _capture
    with _lock:
        _depth -= 1
        if _depth or _capture is None:
            return
        capture, _capture = _capture, None
        with contextlib.suppress(Exception):
            if sys.stderr is not None:
                sys.stderr.flush()
        capture.close()


def _level(value: str | None) -> int:
    """``TF_CPP_MIN_LOG_LEVEL`` as an int (0 when unset or not a number, as TensorFlow)."""
    try:
        return int(value or 0)
    except ValueError:
        return 0
