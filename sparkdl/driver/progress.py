"""Progress of a fit on the driver, fed from the parameter service's status.

``verbose=1`` shows a progress bar (``tqdm.auto``: a terminal bar, or a widget in a
notebook) with the epoch, samples done of the total, the latest loss and samples/s.
Where stderr is not a terminal (a log file, a job's output, CI) a bar would write
every refresh into it: the same figures are written there as one line per finished
epoch instead. Without tqdm installed (``pip install tqdm``, the extra
``sparkdl-keras[progress]``) it prints lines as ``verbose=2`` does: one line per
finished epoch with its merged logs.

Example:
    >>> Progress.POLL_SECONDS
    0.25
"""

from __future__ import annotations

import math
import sys
import threading
import time
from typing import Any

from sparkdl.server.state.events import FitEvents

__all__ = ["Progress"]


class Progress:
    """Follows ``events`` in a driver thread and reports progress.

    Args:
        events: The running fit (the same snapshot ``GET /status`` serves).
        epochs: Epochs of the fit.
        rows: Training rows per epoch (all workers together).
        verbose: 1 for a bar, 2 for a line per epoch.
    """

    POLL_SECONDS = 0.25

    def __init__(self, events: FitEvents, *, epochs: int, rows: int, verbose: int) -> None:
        self._events = events
        self._epochs = epochs
        self._rows = rows
        self._bar: Any = None
        #: verbose=1 away from a terminal: a line per epoch on stderr.
        self._epoch_lines = False
        if verbose == 1:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                tqdm = None
            drawn = tqdm is not None and (notebook_bar(tqdm) or on_terminal())
            self._epoch_lines = tqdm is not None and not drawn
            if drawn:
                # tqdm's own rate is the one rate shown ("12.3k samples/s").
                self._bar = tqdm(
                    total=epochs * rows, unit=" samples", unit_scale=True, dynamic_ncols=True
                )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sparkdl-progress", daemon=True)
        self._printed = 0
        self._started = time.perf_counter()

    def start(self) -> None:
        """Starts following the service."""
        self._thread.start()

    def stop(self) -> None:
        """Reports the last state and stops."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._report()
        if self._bar is not None:
            self._bar.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.POLL_SECONDS):
            self._report()

    def _report(self) -> None:
        status = self._events.status()
        elapsed = time.perf_counter() - self._started
        seen = int(status["samples_seen"])
        if self._bar is not None:
            self._update_bar(status, seen)
            return
        history: dict[str, list[float]] = status["history"]
        while self._printed < status["epochs_done"]:
            i = self._printed
            if self._epoch_lines:  # the bar's figures, where the bar would draw
                print(self._bar_line(i, history, elapsed), file=sys.stderr, flush=True)
            else:
                metrics = " - ".join(f"{k}: {v[i]:.4f}" for k, v in history.items() if i < len(v))
                print(
                    f"Epoch {i + 1}/{self._epochs} - {self._rows} samples - {metrics} - "
                    f"{seen / elapsed if elapsed > 0 else math.nan:,.0f} samples/s",
                    flush=True,
                )
            self._printed += 1

    def _bar_line(self, i: int, history: dict[str, list[float]], elapsed: float) -> str:
        """Epoch ``i``'s line with the bar's figures: samples done of the total, the
        merged loss, samples/s."""
        total = self._epochs * self._rows
        done = min((i + 1) * self._rows, total)
        loss = history.get("loss", [])
        shown = f" - loss: {loss[i]:.4f}" if i < len(loss) else ""
        rate = done / elapsed if elapsed > 0 else math.nan
        return (
            f"Epoch {i + 1}/{self._epochs} - {_size(done)}/{_size(total)} samples{shown}"
            f" - {_size(rate)} samples/s"
        )

    def _update_bar(self, status: dict[str, Any], seen: int) -> None:
        bar = self._bar
        done = min(seen, bar.total)
        epoch = min(done // max(self._rows, 1) + 1, self._epochs)
        losses = [w["last_loss"] for w in status["workers"].values() if w["last_loss"] is not None]
        bar.set_description(f"Epoch {epoch}/{self._epochs}", refresh=False)
        if losses:
            bar.set_postfix({"loss": f"{sum(losses) / len(losses):.4f}"}, refresh=False)
        bar.update(done - bar.n)


def notebook_bar(tqdm: Any) -> bool:
    """Whether ``tqdm.auto`` chose the notebook widget (its class is a subclass of
    ``tqdm.notebook``'s; a notebook's stderr is no terminal, yet it shows the widget)."""
    return any(cls.__module__ == "tqdm.notebook" for cls in getattr(tqdm, "__mro__", ()))


def on_terminal() -> bool:
    """Whether stderr (where a bar draws) is a terminal."""
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def _size(count: float) -> str:
    """``count`` as tqdm's bar shows it: ``2.87k``, ``1.2M``, ``950``.

    Example:
        >>> _size(2874), _size(950), _size(1_234_567)
        ('2.87k', '950', '1.23M')
    """
    if not math.isfinite(count):
        return "?"
    for unit in ("", "k", "M", "G"):
        if abs(count) < 999.5:
            return f"{count:.3g}{unit}" if unit else f"{count:.0f}"
        count /= 1000
    return f"{count:.3g}T"
