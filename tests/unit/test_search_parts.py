"""The search's parts that need no Spark, against a real Optuna study in memory: the
epoch reporter and pruning, the objective's direction and value, and the counting that
lets a stored study resume."""

from __future__ import annotations

import math
import threading

import keras
import pytest

from sparkdl.errors import ConfigError, WorkerError
from sparkdl.search.pruning import TrialReporter, epochs_reported
from sparkdl.search.search import (
    INTERRUPTED,
    STALE,
    _close_stale,
    _direction,
    _final,
    _finished,
    _pruner,
    cluster_failure,
)

optuna = pytest.importorskip("optuna")
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _study(pruner=None):  # type: ignore[no-untyped-def]
    return optuna.create_study(direction="maximize", pruner=pruner or optuna.pruners.NopPruner())


def test_the_reporter_reports_each_epoch_once_and_prunes() -> None:
    study = _study(optuna.pruners.ThresholdPruner(lower=0.5))
    trial = study.ask()
    reporter = _reporter(trial, "val_accuracy")
    reporter.on_epoch_end(0, {"val_accuracy": 0.7, "loss": 1.0})
    reporter.restart()  # a retried fit reports its epoch 0 again: not a second time
    reporter.on_epoch_end(0, {"val_accuracy": 0.9})
    assert reporter.epochs == 1
    assert not reporter.pruned and not reporter.model.stop_training
    # Pruned: the fit is stopped as EarlyStopping stops it (its tasks end, not fail).
    reporter.on_epoch_end(1, {"val_accuracy": 0.2})
    assert reporter.pruned and reporter.model.stop_training
    # An asynchronous fit may close another epoch after the stop: not the trial's.
    reporter.on_epoch_end(2, {"val_accuracy": 0.9})
    assert reporter.epochs == 2
    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    stored = study.trials[0]
    assert stored.intermediate_values == {0: 0.7, 1: 0.2}
    assert epochs_reported(stored) == 2


def test_the_reporter_names_a_missing_objective_and_prunes_a_nan() -> None:
    trial = _study().ask()
    with pytest.raises(KeyError, match=r"val_auc.*'loss'"):
        TrialReporter(trial, "val_auc").on_epoch_end(0, {"loss": 1.0})
    reporter = _reporter(trial, "loss")
    reporter.on_epoch_end(0, {"loss": math.nan})
    assert reporter.pruned and reporter.model.stop_training
    # The search's own stop aborts the fit at once.
    stop = threading.Event()
    stop.set()
    with pytest.raises(optuna.TrialPruned, match="the search stopped"):
        TrialReporter(trial, "loss", stop=stop).on_epoch_end(1, {"loss": 1.0})


def _reporter(trial, objective: str) -> TrialReporter:  # type: ignore[no-untyped-def]
    """A reporter following a model, as the fit's driver callbacks do."""
    reporter = TrialReporter(trial, objective)
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.stop_training = False
    reporter.set_model(model)
    return reporter


def test_asha_judges_trials_after_a_quarter_of_their_epochs_and_keeps_a_third() -> None:
    """8 epochs: Optuna's steps are the 0-based epochs, so the first rung is at step 2
    (after the third epoch); of three trials there, one goes on."""
    pruner = _pruner(optuna, "asha", 8)
    assert (pruner._min_resource, pruner._reduction_factor) == (2, 3)
    assert _pruner(optuna, "asha", 1)._min_resource == 1
    study = _study(pruner)
    stopped = []
    for value in (0.9, 0.8, 0.7):
        trial = study.ask()
        for step in range(3):
            trial.report(value, step)
            if trial.should_prune():
                stopped.append((value, step))
                break
    assert stopped == [(0.8, 2), (0.7, 2)]


def test_the_direction_follows_the_metric_and_an_unknown_one_is_asked_for() -> None:
    assert _direction("val_loss") == "minimize" and _direction("val_mae") == "minimize"
    assert _direction("val_accuracy") == "maximize" and _direction("auc") == "maximize"
    with pytest.raises(ConfigError, match="direction="):
        _direction("my_score")


def test_the_value_is_the_last_epoch_or_the_restored_best() -> None:
    history = {"val_loss": [0.5, 0.3, 0.4]}
    assert _final(history, "val_loss") == 0.4
    assert _final(history, "val_loss", best=True, direction="minimize") == 0.3
    assert _final({"val_loss": [0.5, math.nan]}, "val_loss") is None
    assert _final({}, "val_loss") is None


def test_trials_a_dead_driver_left_running_are_failed_and_do_not_count() -> None:
    study = _study()
    done = study.ask()
    study.tell(done, 0.9)
    study.ask()  # left running, as a killed driver leaves it
    interrupted = study.ask()
    interrupted.set_user_attr("error", INTERRUPTED)
    study.tell(interrupted, state=optuna.trial.TrialState.FAIL)
    own = study.ask()
    own.set_user_attr("error", "ValueError: a bad space")
    study.tell(own, state=optuna.trial.TrialState.FAIL)
    _close_stale(optuna, study)
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "FAIL", "FAIL", "FAIL"]
    assert study.user_attrs[STALE] == [1]
    assert _finished(optuna, study) == 2  # the complete one and the trial's own failure


def test_only_failures_the_cluster_caused_are_retried() -> None:
    assert cluster_failure(WorkerError("lost", {-1: "trace"}))
    assert not cluster_failure(WorkerError("1 worker(s) failed", {0: "trace"}, reported=True))
    assert not cluster_failure(ValueError("a bad model"))


def test_a_search_draws_a_line_per_running_trial_and_a_study_line(monkeypatch, capsys) -> None:
    """On a terminal (tqdm installed): a bar per running trial, redrawn at its epochs
    with its objective, gone when it ends; the ending is printed above the bars and the
    study bar counts it. Elsewhere: one printed line per ended trial."""
    pytest.importorskip("tqdm")
    from types import SimpleNamespace

    from sparkdl.search import progress as progress_module
    from sparkdl.search.progress import SearchProgress

    monkeypatch.setattr(progress_module, "on_terminal", lambda: True)
    shown = SearchProgress(verbose=1, total=2, slots=2, epochs=3)
    assert shown.drawn
    shown.announce(trials=2, workers=1)  # its line, then the study bar under it
    first, second = SimpleNamespace(number=0), SimpleNamespace(number=1)
    shown.started(first)
    shown.started(second)
    shown.epoch(first, 2, "val_accuracy", 0.91)
    shown.ended(first, "sparkdl search: trial 0 COMPLETE (val_accuracy 0.93)", "1 complete")
    third = SimpleNamespace(number=2)
    shown.started(third, epochs=7)  # takes the slot trial 0 left, with its own epochs
    assert shown._bars[2].slot == 1 and shown._bars[2].total == 7
    assert shown._bars[1].slot == 2
    shown.forget(second)  # a trial that ended without its line (interrupted)
    assert set(shown._bars) == {2} and shown._free == [2]
    shown.close()
    err = capsys.readouterr()
    drawn = err.err + err.out
    assert "2 trial(s) to run of 2" in err.out and "search:" in err.err  # line, then bar
    assert "trial 1" in drawn and "val_accuracy 0.91" in drawn
    assert "sparkdl search: trial 0 COMPLETE" in drawn and "1 complete" in drawn

    monkeypatch.setattr(progress_module, "on_terminal", lambda: False)
    plain = SearchProgress(verbose=1, total=2, slots=2, epochs=3)
    assert not plain.drawn
    plain.started(first)
    plain.epoch(first, 1, "val_accuracy", 0.5)
    plain.ended(first, "sparkdl search: trial 0 PRUNED (at epoch 1)", "0 complete, 1 pruned")
    assert capsys.readouterr().out == (
        "sparkdl search: trial 0 PRUNED (at epoch 1) | 0 complete, 1 pruned\n"
    )


def test_fits_of_one_tuner_share_scans_until_the_last_model_is_taken() -> None:
    """KerasEstimator.fitMultiple's iterator: scans are shared from its creation until
    its last model was taken, or a fit failed, or it was dropped."""
    from sparkdl.driver import shared_scans
    from sparkdl.driver.shared_scans import SharingFits

    before = shared_scans._users  # another search of this process may be sharing
    fits = SharingFits(iter([(0, "a"), (1, "b")]), 2)
    assert shared_scans._users == before + 1
    assert next(fits) == (0, "a") and shared_scans._users == before + 1
    assert next(fits) == (1, "b") and shared_scans._users == before

    def failing():  # type: ignore[no-untyped-def]
        yield (0, "a")
        raise RuntimeError("a fit failed")

    broken = SharingFits(failing(), 2)
    next(broken)
    with pytest.raises(RuntimeError, match="a fit failed"):
        next(broken)
    assert shared_scans._users == before

    dropped = SharingFits(iter([(0, "a")]), 3)
    assert shared_scans._users == before + 1
    del dropped
    import gc

    gc.collect()
    assert shared_scans._users == before
