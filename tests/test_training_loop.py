"""The training loop's bookkeeping (`Trainer.__call__`): when it saves, evaluates, reports,
pauses the clocks and stops, driven by scripted updates instead of a model, so that each rule
is checked at the exact update it is about."""
import math
import signal

import pytest
import tensorflow as tf

from tfnmt.training import trainer as trainer_module
from tfnmt.training.stop_signals import TrainingInterrupted
from tfnmt.training.trainer import Trainer, TrainingError

SKIP = "skip"  # an update fp16 loss scaling skipped: the optimizer's count stays


class ScriptedOptimizer:
    """An optimizer's count and learning rate, nothing else."""

    def __init__(self):
        self.iterations = tf.Variable(0, dtype=tf.int64)
        self.learning_rate = 0.5


class Recorder:
    """Stands in for the stats, budget, keeper and stop signals: records what the loop asks."""

    def __init__(self, stop_after=None, evaluation_seconds=0.0, stop_early_at=None):
        self.calls = []
        self.skipped = 0
        self.stop_after, self.stop_early_at = stop_after, stop_early_at
        self.evaluation_seconds = evaluation_seconds
        self.received = None
        self.latest_checkpoint = None

    # stats
    def update(self, outputs):
        self.calls.append(("update", outputs["loss"]))

    def report(self, step, learning_rate):
        self.calls.append(("report", step))

    def pause(self, seconds):
        self.calls.append(("pause", seconds))

    # budget
    def plan(self, step):
        return None

    # keeper
    def save(self, step):
        self.latest_checkpoint = f"ckpt-{step}"
        self.calls.append(("save", step))
        return self.latest_checkpoint

    def newest(self):
        return self.latest_checkpoint

    # evaluate and after_update
    def evaluate(self, step):
        self.calls.append(("evaluate", step))
        return step == self.stop_early_at

    def after_update(self, step, outputs):
        self.calls.append(("after_update", step))
        if step == self.stop_after:
            self.received = signal.SIGTERM

    def of(self, kind):
        return [value for name, value in self.calls if name == kind]


def scripted_trainer(script):
    """A Trainer whose updates follow `script`: a gradient norm per update, or SKIP."""
    trainer = Trainer.__new__(Trainer)
    trainer.optimizer = ScriptedOptimizer()
    updates = iter(script)

    def train_step(iterator):
        grad_norm = next(updates)
        if grad_norm != SKIP:
            trainer.optimizer.iterations.assign_add(1)
        return {"loss": 2.0, "grad_norm": float("nan") if grad_norm == SKIP else grad_norm}

    trainer.train_step = train_step
    return trainer


def run(trainer, recorder, train_steps, **kwargs):
    return trainer(None, train_steps, keeper=recorder, stats=recorder,
                   after_update=recorder.after_update, stop=recorder, **kwargs)


def test_a_finite_loss_with_a_non_finite_gradient_is_divergence_and_not_saved():
    # The update applied those gradients: its weights are not finite, so it is neither saved
    # nor passed on, and the checkpoints before it are named.
    recorder = Recorder()
    with pytest.raises(TrainingError, match=r"^step 3: loss 2.0, gradient norm inf: training "
                                            r"has diverged.*\(newest: ckpt-2\)"):
        run(scripted_trainer([1.0, 1.0, math.inf, 1.0]), recorder, 4, checkpoint_every=1)
    assert recorder.of("save") == [1, 2] and recorder.of("after_update") == [1, 2]


def test_evaluations_come_between_updates_and_their_time_is_not_training_time():
    # Every second update but the last (the run's final evaluation follows the loop); the
    # seconds each takes are taken out of the stats' and the budget's clocks.
    recorder = Recorder()
    step = run(scripted_trainer([1.0] * 6), recorder, 6, evaluate=recorder.evaluate,
               eval_every=2, checkpoint_every=100, log_every=100, budget=recorder)
    assert step == 6 and recorder.of("evaluate") == [2, 4]
    pauses = recorder.of("pause")
    assert len(pauses) == 4 and all(0 <= seconds < 5 for seconds in pauses)  # stats, budget
    assert recorder.of("report") == [6] and recorder.of("save") == [6]


def test_a_wall_clock_step_during_an_evaluation_is_not_taken_out_of_training_time(monkeypatch):
    # A laptop suspended during a dev evaluation (or a clock step): the wall clock moves on by
    # hours, the budget's monotonic clock does not. The pause was measured on the wall clock,
    # and taking 8 hours out of 10 seconds of training planned the run hours longer.
    import time

    wall = [time.time()]
    monkeypatch.setattr(time, "time", lambda: wall[0])

    class Suspending(Recorder):
        def evaluate(self, step):
            wall[0] += 8 * 3600
            return super().evaluate(step)

    recorder = Suspending()
    run(scripted_trainer([1.0] * 4), recorder, 4, evaluate=recorder.evaluate, eval_every=2,
        checkpoint_every=100, log_every=100, budget=recorder)
    pauses = recorder.of("pause")
    assert len(pauses) == 2 and all(0 <= seconds < 5 for seconds in pauses)  # stats, budget


def test_an_early_stop_saves_the_update_it_stopped_at():
    recorder = Recorder(stop_early_at=3)
    step = run(scripted_trainer([1.0] * 6), recorder, 6, evaluate=recorder.evaluate,
               eval_every=1, checkpoint_every=2, log_every=100)
    assert step == 3 and recorder.of("save") == [2, 3] and recorder.of("evaluate") == [1, 2, 3]
    recorder = Recorder(stop_early_at=4)  # a checkpoint step: saved once
    run(scripted_trainer([1.0] * 6), recorder, 6, evaluate=recorder.evaluate, eval_every=2,
        checkpoint_every=2, log_every=100)
    assert recorder.of("save") == [2, 4]


@pytest.mark.parametrize("stop_after, saves", [(3, [2, 3]), (4, [2, 4]), (5, [2, 4, 5])])
def test_a_signal_stops_after_the_update_and_saves_it_once(stop_after, saves):
    # Update 5 is the run's last: saved as such, not a second time for the signal.
    recorder = Recorder(stop_after=stop_after)
    with pytest.raises(TrainingInterrupted) as interrupted:
        run(scripted_trainer([1.0] * 5), recorder, 5, checkpoint_every=2, log_every=100)
    assert (interrupted.value.step, interrupted.value.checkpoint) == \
        (stop_after, f"ckpt-{stop_after}")
    assert interrupted.value.signum == signal.SIGTERM
    assert recorder.of("save") == saves


def test_skipped_updates_are_divergence_only_when_too_many_come_in_a_row(monkeypatch):
    monkeypatch.setattr(trainer_module, "MAX_SKIPPED_IN_A_ROW", 3)
    recorder = Recorder()
    # Three skips, an update, three more: never four in a row.
    assert run(scripted_trainer([SKIP] * 3 + [1.0] + [SKIP] * 3 + [1.0]), recorder, 2) == 2
    assert recorder.skipped == 6 and recorder.of("after_update") == [1, 2]
    with pytest.raises(TrainingError, match="^step 2: 4 updates in a row had non-finite"):
        run(scripted_trainer([1.0] + [SKIP] * 4 + [1.0]), Recorder(), 2)
