import keras
import numpy as np
import pytest
import tensorflow as tf

from tfnmt.training.schedule import NoamSchedule, paper_adam


def formula(step, d_model, warmup, scale=1.0):
    return scale * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


@pytest.mark.parametrize("step", [1, 4000, 40000])
def test_values_match_the_paper(step):
    schedule = NoamSchedule(512, warmup_steps=4000, scale=2.0)
    # Keras passes optimizer.iterations, which is step - 1 during the step-th update.
    assert float(schedule(step - 1)) == pytest.approx(formula(step, 512, 4000, 2.0), rel=1e-6)


def test_peak_is_at_warmup():
    schedule = NoamSchedule(256, warmup_steps=100)
    rates = [float(schedule(i)) for i in range(300)]
    assert int(np.argmax(rates)) == 99  # the 100th update
    assert rates[0] > 0.0


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        NoamSchedule(512, warmup_steps=0)


def test_optimizer_with_schedule_saves_and_reloads(tmp_path):
    optimizer = paper_adam(64, warmup_steps=10, scale=0.5)
    var = tf.Variable([1.0, 2.0])
    for _ in range(3):
        optimizer.apply_gradients([(tf.constant([0.1, -0.2]), var)])
    # Config round trip through Keras serialisation (the schedule is registered).
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    schedule_config = restored.get_config()["learning_rate"]
    assert schedule_config == optimizer.get_config()["learning_rate"]
    assert keras.saving.deserialize_keras_object(schedule_config).get_config() == {
        "d_model": 64, "warmup_steps": 10, "scale": 0.5}
    assert (restored.beta_1, restored.beta_2, restored.epsilon) == (0.9, 0.98, 1e-9)
    # State round trip through a checkpoint: the step count and the schedule's rate carry over.
    tf.train.Checkpoint(optimizer=optimizer, var=var).write(str(tmp_path / "ckpt"))
    var2 = tf.Variable([0.0, 0.0])
    restored.build([var2])
    tf.train.Checkpoint(optimizer=restored, var=var2).read(str(tmp_path / "ckpt")).assert_consumed()
    assert int(restored.iterations) == 3
    # optimizer.learning_rate reads the schedule at the current step: the 4th update is next.
    assert float(restored.learning_rate) == pytest.approx(formula(4, 64, 10, 0.5))
    np.testing.assert_allclose(var2.numpy(), var.numpy())
