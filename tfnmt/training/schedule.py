"""The paper's learning-rate schedule (§5.3) and Adam settings."""
import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="tfnmt")
class NoamSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lr = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5), step counted from 1.

    Keras passes `optimizer.iterations` (0 before the first update), so the rate of the n-th
    update is `schedule(n - 1)`: the first update uses step 1, never step 0 (which would be 0).

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

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0
        return (self.scale * self.d_model ** -0.5
                * tf.minimum(tf.math.rsqrt(step), step * self.warmup_steps ** -1.5))

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}


def paper_adam(d_model, warmup_steps=4000, scale=1.0, optimizer_class=keras.optimizers.Adam,
               **kwargs):
    """The paper's optimizer (§5.3): Adam(beta_1=0.9, beta_2=0.98, epsilon=1e-9) on the Noam
    schedule.

    Args:
      d_model, warmup_steps, scale: the `NoamSchedule`'s.
      optimizer_class: an Adam class (training uses `PreReducedAdam`).
      **kwargs: more arguments for the optimizer.

    Returns:
      The optimizer.
    """
    return optimizer_class(learning_rate=NoamSchedule(d_model, warmup_steps, scale),
                           beta_1=0.9, beta_2=0.98, epsilon=1e-9, **kwargs)
