"""Where a hosted service's address waits for the relay's poll tasks on one machine.

With ``service_placement="cluster"`` the service runs beside a worker
(:mod:`sparkdl.executor.hosting`); each worker writes every shard's address (never the
token) to a *rendezvous file* in a directory of this user's alone, and the relay's poll
tasks (:mod:`sparkdl.driver.relay`, run on an executor of the same machine) read the
newest. Both sides import this module; it imports neither.

Example:
    >>> safe_name("fit/1 ok")
    'fit1ok'
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from typing import Any

__all__ = ["read_rendezvous", "rendezvous_dir", "rendezvous_files", "safe_name", "write_rendezvous"]


def rendezvous_dir() -> str:
    """This machine's directory of rendezvous and snapshot files (the user's only)."""
    path = os.path.join(tempfile.gettempdir(), f"sparkdl-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise PermissionError(
            f"{path} is not a directory of this user's alone (another user's, a link, or "
            "open to others): remove it, or set TMPDIR for the executors."
        )
    return path


def read_rendezvous(fit_id: str) -> dict[str, Any] | None:
    """The service's addresses as the newest task attempt on this machine wrote them
    (``urls`` and ``certs``, one per shard), or ``None``.

    Each worker writes a file of its own, named by its task attempt (a worker that ends
    early removes only its own); the highest attempt id is the newest stage attempt's,
    whose service is the live one (Spark numbers task attempts in launch order).
    """
    files = rendezvous_files(fit_id)
    if not files:
        return None
    try:
        with open(files[max(files)]) as f:
            found: dict[str, Any] = json.load(f)
    except (OSError, ValueError):
        return None
    return found


def write_rendezvous(fit_id: str, worker: int, attempt: int, found: dict[str, Any]) -> str:
    """Writes the service's addresses (every shard's URL and certificate) where relay
    tasks find them, in this task attempt's own file; removes the files of older
    attempts of this fit on this machine (a killed attempt's, which name a dead
    service)."""
    path = os.path.join(rendezvous_dir(), f"{safe_name(fit_id)}.a{attempt}.w{worker}.json")
    text = json.dumps({"urls": list(found["urls"]), "certs": list(found["certs"])})
    fd, staging = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".rendezvous-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(staging, path)
    for older, stale in rendezvous_files(fit_id).items():
        if older < attempt:
            with contextlib.suppress(OSError):
                os.remove(stale)
    return path


def rendezvous_files(fit_id: str) -> dict[int, str]:
    """This fit's rendezvous files on this machine, by task attempt id."""
    directory = rendezvous_dir()
    prefix = f"{safe_name(fit_id)}.a"
    found: dict[int, str] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            if not (name.startswith(prefix) and name.endswith(".json")):
                continue
            attempt = name[len(prefix) :].split(".", 1)[0]
            if attempt.isdigit():
                found[int(attempt)] = os.path.join(directory, name)
    return found


def safe_name(fit_id: str) -> str:
    return "".join(c for c in fit_id if c.isalnum() or c in "-_")[:100]
