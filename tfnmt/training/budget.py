"""A run that trains for a time instead of a number of updates (`train.py --train_minutes`).

The number of updates that fit is not known before training: it depends on the CPU, the
precision and what else the machine does. `TrainingBudget` measures the pace as the run goes and
plans the last update from it: first once the first `settle_steps` updates (tracing, first
kernels) are behind it, then again at every call until `freeze_fraction` of the budget has
passed, each time from the pace of the later half of the training time so far. From then on the
plan stays. A budget spent before the plan stays (one shorter than the settling updates take)
ends the run at the update that spends it. Dev evaluations are not training time (`pause`). A
run stopped before its plan stayed goes on planning when resumed, for what is left of the budget
(`spent_seconds`, saved with each checkpoint by `trainer.CheckpointKeeper`). With a schedule
that decays to zero at the last update (`schedule.LinearDecaySchedule`), the run moves that end
with each plan; while the warm-up lasts (800 updates in the `cpu` preset) the plan does not
change the rate yet.
"""
import time


class TrainingBudget:
    """Plans how many updates fit in `minutes` of training.

    Args:
      minutes: the training time (> 0).
      first_step: the optimizer's step when the run starts (its updates so far count as done).
      spent_seconds: training seconds a resumed run had already spent of the budget.
      settle_steps: updates before the first plan.
      freeze_fraction: the share of the budget after which the plan stays.
      margin: the share of the remaining time left unplanned (the last checkpoint, slower
        steps).
      interval: updates between the points of the pace's history.
      clock: a function returning seconds (tests give their own).

    Example:
      budget = TrainingBudget(11, first_step=0)
      planned = budget.plan(step)  # None, or the new last update
    """

    def __init__(self, minutes, first_step=0, spent_seconds=0.0, settle_steps=30,
                 freeze_fraction=0.5, margin=0.02, interval=10, clock=time.monotonic):
        if minutes <= 0:
            raise ValueError(f"minutes must be positive, got {minutes}")
        if not spent_seconds >= 0:
            raise ValueError(f"spent_seconds must be >= 0, got {spent_seconds}")
        self.seconds = 60.0 * minutes
        self.spent_seconds = float(spent_seconds)
        self.first_step, self.settle_steps = int(first_step), int(settle_steps)
        self.interval = int(interval)
        self.freeze_fraction, self.margin, self.clock = freeze_fraction, margin, clock
        self.start, self.paused = clock(), 0.0
        self.history = []  # [(step, training seconds)] from the settled step on
        self.planned = None
        self.planned_count = 0  # plans made (each a change)
        self.frozen = False
        self.freeze_after = freeze_fraction * self.seconds  # training seconds

    def elapsed(self):
        """Training seconds so far, a resumed run's earlier ones included (evaluations left
        out)."""
        return self.spent_seconds + self.clock() - self.start - self.paused

    def pause(self, seconds):
        """Leaves `seconds` (a dev evaluation) out of the training time."""
        self.paused += seconds

    def restart(self, step):
        """Plans again from the pace of the updates after `step`, whose pace differs from
        before (the train step changed): the history is dropped, and the plan is revised until
        half the budget, or for a tenth of it from here if that is later.

        Args:
          step: the optimizer's step where the new pace starts.
        """
        self.first_step, self.history, self.frozen = int(step), [], False
        self.freeze_after = min(max(self.freeze_fraction * self.seconds,
                                    self.elapsed() + 0.1 * self.seconds), self.seconds)

    def plan(self, step):
        """Called after each update.

        Args:
          step: the optimizer's step (updates applied).

        Returns:
          The planned last update when it changed or froze, else None.
        """
        if self.frozen:
            return None
        elapsed = self.elapsed()
        if elapsed >= self.seconds:  # spent (before a first plan, too): this update is the last
            self.frozen = True
            self.planned_count += self.planned != step
            self.planned = step
            return step
        done = step - self.first_step
        if done < self.settle_steps or done % self.interval:
            return None
        self.history.append((step, elapsed))
        if len(self.history) < 2:
            return None
        # The pace of the later half of the training time so far.
        later = [h for h in self.history if h[1] >= elapsed / 2] or self.history[-2:]
        first = later[0] if later[0] != self.history[-1] else self.history[-2]
        pace = (step - first[0]) / max(elapsed - first[1], 1e-6)  # updates per second
        remaining = max(self.seconds - elapsed, 0.0) * (1.0 - self.margin)
        planned = max(step + int(pace * remaining), step + 1)
        self.frozen = elapsed >= self.freeze_after
        if planned == self.planned:
            # Unchanged, but the plan that freezes is reported (and saved) all the same.
            return planned if self.frozen else None
        self.planned = planned
        self.planned_count += 1
        return planned
