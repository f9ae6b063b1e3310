"""Learning-rate schedules and the paper's Adam settings (§5.3).

`NoamSchedule` is the paper's: linear warm-up, then decay as 1/sqrt(step), for runs of open
length. `LinearDecaySchedule` warms up the same way to the same peak, then falls linearly to zero
at the last step: for a run whose length is known, it ends with small, averaging steps instead
of at a high rate.
"""
import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="tfnmt")
class NoamSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lr = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5), step counted from 1.

    Keras passes `optimizer.iterations` (0 before the first update), so the rate of the n-th
    update is `schedule(n - 1)`: the first update uses step 1, never step 0 (which would be 0).

    `set_plan` can change the warm-up's length at the same peak while a run trains (a run
    planned to fit a time budget, `budget.TrainingBudget`): the traced training step reads it
    from a variable.

    Args:
      d_model: the model width.
      warmup_steps: updates of linear warm-up (paper: 4000).
      scale: a factor on the whole schedule.

    Example:
      optimizer = keras.optimizers.Adam(NoamSchedule(512, 4000))
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0):
        if d_model <= 0 or warmup_steps <= 0 or scale <= 0:
            raise ValueError(f"d_model, warmup_steps and scale must be positive, got "
                             f"{d_model}, {warmup_steps}, {scale}")
        self.d_model = int(d_model)
        self.warmup_steps = int(warmup_steps)
        self.scale = float(scale)
        # The rate at the end of the warm-up, whatever its length (`set_plan`): the formula
        # above is peak * min(sqrt(warmup_steps / step), step / warmup_steps).
        self._peak = self.scale * self.d_model ** -0.5 * self.warmup_steps ** -0.5
        self._warmup = _warmup_variable(self.warmup_steps)

    def set_plan(self, total_steps, warmup_steps=None):
        """For a run planned to end at update `total_steps` (> 0; the 1/sqrt decay has no end):
        with `warmup_steps` (> 0), makes the warm-up that long with the same peak (`scale`
        changes so that `get_config` gives this schedule back)."""
        _check_plan(total_steps, warmup_steps)
        if warmup_steps is not None:
            _set_warmup(self, warmup_steps)

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0
        warmup = tf.cast(self._warmup, tf.float32)
        return self._peak * tf.minimum(tf.sqrt(warmup / step), step / warmup)

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}


def _warmup_variable(warmup_steps):
    # Not checkpointed (a plain attribute of an object no checkpoint tracks): the run's
    # settings record its plan, and get_config gives it back.
    return tf.Variable(float(warmup_steps), trainable=False, name="lr_warmup_steps")


def _check_plan(total_steps, warmup_steps):
    if total_steps <= 0 or (warmup_steps is not None and warmup_steps <= 0):
        raise ValueError(f"total_steps and warmup_steps must be positive, got "
                         f"{total_steps}, {warmup_steps}")


def _set_warmup(schedule, warmup_steps):
    """Makes `schedule`'s warm-up `warmup_steps` long, to the same peak (`scale` changes)."""
    schedule.scale *= (int(warmup_steps) / schedule.warmup_steps) ** 0.5
    schedule.warmup_steps = int(warmup_steps)
    schedule._warmup.assign(float(schedule.warmup_steps))


@keras.saving.register_keras_serializable(package="tfnmt")
class LinearDecaySchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Noam's warm-up to Noam's peak, then linear decay to zero at `total_steps`.

    lr = peak * step / warmup_steps up to the peak, then
    peak * (total_steps + 1 - step) / (total_steps + 1 - warmup_steps): the last update
    (step = total_steps) still moves the weights, and every later one has rate 0. Here
    peak = scale * d_model^-0.5 * warmup_steps^-0.5 and step counts from 1, as for
    `NoamSchedule`.

    `set_plan` moves the end, and can shorten the warm-up at the same peak, while a run trains
    (a run planned to fit a time budget, `budget.TrainingBudget`): the traced training step
    reads both from variables.

    Args:
      d_model: the model width.
      warmup_steps: updates of linear warm-up.
      total_steps: the run's length: its last update has the last non-zero rate. At most
        `warmup_steps` gives warm-up only, then zero.
      scale: a factor on the whole schedule.

    Example:
      optimizer = keras.optimizers.Adam(LinearDecaySchedule(256, 300, 1200))
    """

    def __init__(self, d_model, warmup_steps, total_steps, scale=1.0):
        if d_model <= 0 or warmup_steps <= 0 or total_steps <= 0 or scale <= 0:
            raise ValueError(f"d_model, warmup_steps, total_steps and scale must be positive, "
                             f"got {d_model}, {warmup_steps}, {total_steps}, {scale}")
        self.d_model = int(d_model)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.scale = float(scale)
        self._peak = self.scale * self.d_model ** -0.5 * self.warmup_steps ** -0.5
        # Not checkpointed, as the warm-up's (`_warmup_variable`).
        self._total = tf.Variable(float(self.total_steps), trainable=False,
                                  name="lr_total_steps")
        self._warmup = _warmup_variable(self.warmup_steps)

    def set_plan(self, total_steps, warmup_steps=None):
        """Moves the last update with a non-zero rate to `total_steps`, and with `warmup_steps`
        makes the warm-up that long with the same peak (`scale` changes so that
        `get_config` gives this schedule back).

        Args:
          total_steps: the new last update (> 0).
          warmup_steps: the new warm-up length (> 0), or None to keep it.
        """
        _check_plan(total_steps, warmup_steps)
        self.total_steps = int(total_steps)
        self._total.assign(float(self.total_steps))
        if warmup_steps is not None:
            _set_warmup(self, warmup_steps)

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0
        total = tf.cast(self._total, tf.float32)
        warmup = tf.cast(self._warmup, tf.float32)
        rising = step / warmup
        falling = (total + 1.0 - step) / tf.maximum(total + 1.0 - warmup, 1.0)
        return self._peak * tf.maximum(tf.minimum(rising, falling), 0.0)

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps, "scale": self.scale}


SCHEDULES = ("rsqrt", "linear")


def make_schedule(d_model, warmup_steps=4000, scale=1.0, decay="rsqrt", total_steps=None):
    """The learning-rate schedule: `NoamSchedule`, or `LinearDecaySchedule` with
    `decay="linear"`.

    Args:
      d_model, warmup_steps, scale: the schedule's.
      decay: "rsqrt" (the paper's 1/sqrt(step)) or "linear" (to zero at `total_steps`).
      total_steps: the run's length; needed by "linear".

    Returns:
      The schedule.
    """
    if decay == "rsqrt":
        return NoamSchedule(d_model, warmup_steps, scale)
    if decay == "linear":
        if not total_steps:
            raise ValueError("decay='linear' needs total_steps")
        return LinearDecaySchedule(d_model, warmup_steps, total_steps, scale)
    raise ValueError(f"unknown decay {decay!r}; choose one of {', '.join(SCHEDULES)}")


def paper_adam(d_model, warmup_steps=4000, scale=1.0, optimizer_class=keras.optimizers.Adam,
               decay="rsqrt", total_steps=None, schedule=None, **kwargs):
    """The paper's optimizer (§5.3): Adam(beta_1=0.9, beta_2=0.98, epsilon=1e-9) on the Noam
    schedule, or on `LinearDecaySchedule` with `decay="linear"`.

    Args:
      d_model, warmup_steps, scale, decay, total_steps: the schedule's (`make_schedule`).
      optimizer_class: an Adam class (training uses `PreReducedAdam`).
      schedule: a schedule made already (the arguments above are then not used).
      **kwargs: more arguments for the optimizer.

    Returns:
      The optimizer.
    """
    if schedule is None:
        schedule = make_schedule(d_model, warmup_steps, scale, decay, total_steps)
    return optimizer_class(learning_rate=schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9,
                           **kwargs)
