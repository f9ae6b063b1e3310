import pytest

from tfnmt.training.budget import TrainingBudget


class Clock:
    """Seconds that move only when told."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def run(budget, clock, seconds_per_step, steps, first=0):
    """Steps the budget at a fixed pace; -> [(step, plan)] of the plans it made."""
    plans = []
    for step in range(first + 1, first + steps + 1):
        clock.now += seconds_per_step
        planned = budget.plan(step)
        if planned is not None:
            plans.append((step, planned))
    return plans


def test_a_steady_pace_plans_what_fits():
    # 1 minute at 10 updates/s: 600 updates, less the 2% margin of what remains.
    clock = Clock()
    budget = TrainingBudget(1.0, settle_steps=30, freeze_fraction=0.5, margin=0.02,
                            interval=10, clock=clock)
    plans = run(budget, clock, 0.1, 299)
    assert plans[0][0] == 40  # settled at 30, then one interval for a pace
    for step, planned in plans:
        assert planned == pytest.approx(step + 10 * (60 - step * 0.1) * 0.98, abs=2)
    assert not budget.frozen
    plans += run(budget, clock, 0.1, 100, first=299)
    assert budget.frozen and plans[-1][0] <= 300  # from half of the minute on, no new plans
    assert budget.planned == plans[-1][1] == pytest.approx(594, abs=2)


def test_a_plan_that_freezes_unchanged_is_reported():
    # Without a margin a steady pace plans the same last update at every check: the first
    # plan and the frozen one are both reported (the run logs and saves the final plan).
    clock = Clock()
    budget = TrainingBudget(1.0, settle_steps=30, freeze_fraction=0.5, margin=0.0,
                            interval=10, clock=clock)
    plans = run(budget, clock, 0.125, 400)  # 8 updates/s, in exact binary fractions
    assert budget.frozen and plans == [(40, 480), (240, 480)]  # frozen at half the minute


def test_the_pace_of_the_later_half_counts():
    # Slow first updates (tracing, first kernels), then four times faster.
    clock = Clock()
    budget = TrainingBudget(2.0, clock=clock)
    run(budget, clock, 0.4, 50)  # 20 s
    run(budget, clock, 0.1, 500, first=50)  # 50 s more: frozen at 60 s
    assert budget.frozen
    # At 60 s: step 450, and 60 s left at ~10 updates/s.
    assert budget.planned == pytest.approx(450 + 10 * 60 * 0.98, rel=0.03)


def test_paused_time_is_not_training_time():
    clock = Clock()
    budget = TrainingBudget(1.0, clock=clock)
    run(budget, clock, 0.1, 100)
    budget.pause(120.0)
    clock.now += 120.0  # a long dev evaluation
    plans = run(budget, clock, 0.1, 100, first=100)
    assert not budget.frozen
    assert plans[-1][1] == pytest.approx(200 + 10 * 40 * 0.98, abs=3)


def test_a_budget_spent_ends_the_run_at_the_update_that_spends_it():
    clock = Clock()
    budget = TrainingBudget(0.01, settle_steps=1, interval=1, clock=clock)  # 0.6 s
    assert run(budget, clock, 1.0, 3) == [(1, 1)] and budget.frozen
    # Before the first plan: 30 settling updates of 7 s each would overshoot a minute by 2.5
    # minutes; the ninth update spends it (63 s).
    clock = Clock()
    budget = TrainingBudget(1.0, settle_steps=30, interval=10, clock=clock)
    assert run(budget, clock, 7.0, 40) == [(9, 9)] and budget.frozen
    # Resumed with its budget spent: the first update is the last.
    clock = Clock()
    budget = TrainingBudget(1.0, first_step=50, spent_seconds=60.0, clock=clock)
    assert run(budget, clock, 1.0, 5, first=50) == [(51, 51)]
    with pytest.raises(ValueError):
        TrainingBudget(0)


@pytest.mark.parametrize("restart_seconds", [20.0, 40.0])
def test_a_restart_plans_from_the_new_pace(restart_seconds):
    # 10 updates/s, then (a retraced, slower step) 5 updates/s from the restart on: before the
    # plan froze at 30 s, or after it (re-planned for a tenth of the budget, 6 s, from there).
    clock = Clock()
    budget = TrainingBudget(1.0, clock=clock)
    first = int(restart_seconds * 10)
    run(budget, clock, 0.1, first)
    budget.restart(first)
    assert not budget.frozen
    run(budget, clock, 0.2, 1000, first=first)
    assert budget.frozen
    freeze = max(30.0, restart_seconds + 6.0)
    at_freeze = first + 5 * (freeze - restart_seconds)
    assert budget.planned == pytest.approx(at_freeze + 5 * (60 - freeze) * 0.98, abs=3)


def test_a_resumed_run_plans_what_is_left_of_the_budget():
    # 16 s of a minute were spent before the stop; the resumed run goes at 4 updates/s from
    # step 200. Its plans count from 16 s, not from 0, and the plan stays at half the minute.
    clock = Clock()
    budget = TrainingBudget(1.0, first_step=200, spent_seconds=16.0, clock=clock)
    assert budget.elapsed() == 16.0
    plans = run(budget, clock, 0.25, 200, first=200)
    # Settled after 30 updates (23.5 s), a pace at 40 (26 s): 34 s left at 4 updates/s.
    assert plans[0] == (240, 240 + int(4 * 34 * 0.98))
    # Frozen at the first check from 30 s on: step 260, 31 s, 29 s left.
    assert budget.frozen and plans[-1] == (260, 260 + int(4 * 29 * 0.98))
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="spent_seconds"):
            TrainingBudget(1.0, spent_seconds=bad)


def test_a_restart_after_the_plan_froze_revises_it_for_a_tenth_of_the_budget():
    # Frozen at 30 s; restarted at 40 s (a slower step from there): the plans are revised
    # until 46 s, not frozen on the first pace after the restart. Paces in exact binary
    # fractions of a second.
    clock = Clock()
    budget = TrainingBudget(1.0, clock=clock)
    run(budget, clock, 0.125, 320)  # 40 s
    assert budget.frozen
    budget.restart(320)
    # Settled after 30 updates (43.75 s), a pace at 360 (45 s): 8 updates/s, 15 s left.
    assert run(budget, clock, 0.125, 40, first=320) == [(360, 360 + int(8 * 15 * 0.98))]
    assert not budget.frozen
    # Slower from 45 s: at 370 (47.5 s) 20 updates in 3.75 s since 350, 12.5 s left; frozen.
    assert run(budget, clock, 0.25, 100, first=360) == [
        (370, 370 + int(20 / 3.75 * 12.5 * 0.98))]
    assert budget.frozen


def test_a_stall_does_not_end_the_run():
    # Ten updates that take 16 s (the machine busy elsewhere) after 4 s of training: the
    # later half of the time holds only the last point, and the pace is taken over the stall
    # (10 updates in 16 s), not over no time at all (which would plan the next update last).
    clock = Clock()
    budget = TrainingBudget(10.0, clock=clock)
    run(budget, clock, 0.1, 40)  # 4 s
    assert run(budget, clock, 1.6, 10, first=40) == [(50, 50 + int(10 / 16 * 580 * 0.98))]
