"""What a search shows while it runs: a line per running trial and a study line.

On a terminal or in a notebook with tqdm installed (the extra ``sparkdl-keras[progress]``),
``verbose=1`` draws a study bar (this run's trials done of those it has to run, with how many
completed, were pruned and failed, and the best value so far) and under it one bar per
running trial (its epochs, with its last objective value), redrawn at each of the
trial's epochs; a trial's bar goes when it ends, and a line saying how it ended is
printed above the bars. Elsewhere (a log file, a job's stdout) each trial's end is one
printed line, with the same counts. ``verbose=2`` prints those lines and a line per
trial epoch instead of drawing bars.

Example:
    >>> shown = SearchProgress(verbose=0, total=8, slots=2, epochs=5)
    >>> shown.drawn
    False
"""

from __future__ import annotations

import threading
from typing import Any

from sparkdl.driver.progress import notebook_bar, on_terminal

__all__ = ["SearchProgress"]


class SearchProgress:
    """A search's study line and its running trials' lines.

    Args:
        verbose: The search's ``verbose``.
        total: Trials the study should hold.
        slots: Trials run at once.
        epochs: Each trial's epochs (a bar's length).
    """

    def __init__(self, verbose: int, total: int, slots: int, epochs: int) -> None:
        self.verbose = verbose
        self.total, self.slots, self.epochs = total, slots, epochs
        self._lock = threading.Lock()
        self._bars: dict[int, Any] = {}
        self._free = list(range(1, slots + 1))
        self._tqdm: Any = None
        if verbose == 1:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None and (notebook_bar(tqdm) or on_terminal()):
                self._tqdm = tqdm
        self.drawn = self._tqdm is not None
        self._study: Any = None  # drawn by announce(), below its line

    def announce(self, trials: int, workers: int) -> None:
        """The search's first line: trials to run of the study's ``trials``, how many
        at once and with how many workers each."""
        if self.verbose:
            print(
                f"sparkdl search: {self.total} trial(s) to run of {trials}, "
                f"{self.slots} at once, {workers} worker(s) each",
                flush=True,
            )
        if self.drawn:
            self._study = self._tqdm(
                total=self.total, position=0, desc="search", unit="trial", leave=True
            )

    def started(self, trial: Any, epochs: int | None = None) -> None:
        """A trial's fit of ``epochs`` epochs (default: the search's) starts: its line."""
        if not self.drawn:
            return
        with self._lock:
            slot = self._free.pop(0) if self._free else len(self._bars) + 1
            self._bars[trial.number] = self._tqdm(
                total=epochs or self.epochs,
                position=slot,
                desc=f"trial {trial.number}",
                unit="epoch",
                leave=False,
            )
            self._bars[trial.number].slot = slot

    def epoch(self, trial: Any, epochs: int, objective: str, value: float) -> None:
        """A trial ended its ``epochs``-th epoch with ``value``."""
        if not self.drawn:
            return
        with self._lock:
            bar = self._bars.get(trial.number)
            if bar is not None:
                bar.update(max(0, epochs - bar.n))
                bar.set_postfix_str(f"{objective} {value:.4g}", refresh=True)

    def ended(self, trial: Any, line: str, counts: str) -> None:
        """A trial ended: its line goes, ``line`` is printed, the study line counts it."""
        if not self.verbose:
            return
        if not self.drawn:
            print(f"{line} | {counts}", flush=True)
            return
        with self._lock:
            self._drop(trial)
            self._tqdm.write(line)
            if self._study is not None:
                self._study.update(1)
                self._study.set_postfix_str(counts, refresh=True)

    def forget(self, trial: Any) -> None:
        """Removes a trial's line if it still has one (a trial that ended without
        :meth:`ended`: interrupted, or its study's storage failed)."""
        if not self.drawn:
            return
        with self._lock:
            self._drop(trial)

    def _drop(self, trial: Any) -> None:
        """Closes the trial's bar, if it has one, and frees its slot (lock held)."""
        bar = self._bars.pop(trial.number, None)
        if bar is not None:
            self._free.append(bar.slot)
            self._free.sort()
            bar.close()

    def close(self) -> None:
        """Closes every line (the search ended or was interrupted)."""
        if not self.drawn:
            return
        with self._lock:
            for bar in self._bars.values():
                bar.close()
            self._bars.clear()
            if self._study is not None:
                self._study.close()
