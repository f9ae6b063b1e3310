import keras
import numpy as np
import pytest
import tensorflow as tf

from tfnmt.training.schedule import LinearDecaySchedule, NoamSchedule, paper_adam


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


def linear_formula(step, d_model, warmup, total, scale=1.0):
    peak = scale * d_model ** -0.5 * warmup ** -0.5
    if step <= warmup:
        return peak * step / warmup
    return peak * max(total + 1 - step, 0) / (total + 1 - warmup)


@pytest.mark.parametrize("step", [1, 50, 100, 101, 650, 1199, 1200, 1201, 1300])
def test_linear_decay_values(step):
    schedule = LinearDecaySchedule(256, warmup_steps=100, total_steps=1200, scale=1.5)
    assert float(schedule(step - 1)) == pytest.approx(
        linear_formula(step, 256, 100, 1200, 1.5), rel=1e-6, abs=1e-12)


def test_linear_decay_peaks_with_noam_and_ends_at_zero():
    linear = LinearDecaySchedule(256, warmup_steps=100, total_steps=400)
    noam = NoamSchedule(256, warmup_steps=100)
    rates = [float(linear(i)) for i in range(500)]
    assert int(np.argmax(rates)) == 99
    assert rates[99] == pytest.approx(float(noam(99)), rel=1e-6)
    assert rates[399] > 0.0 and rates[400:] == [0.0] * 100  # the 400th update is the last
    assert all(a >= b for a, b in zip(rates[99:], rates[100:]))


def test_linear_decay_shorter_than_warmup_and_bad_settings():
    schedule = LinearDecaySchedule(64, warmup_steps=100, total_steps=50)
    assert float(schedule(49)) > 0.0 and float(schedule(50)) == 0.0
    with pytest.raises(ValueError):
        LinearDecaySchedule(64, warmup_steps=10, total_steps=0)
    with pytest.raises(ValueError, match="total_steps"):
        paper_adam(64, 10, decay="linear")
    with pytest.raises(ValueError, match="unknown decay"):
        paper_adam(64, 10, decay="cosine")


def test_linear_optimizer_config_round_trip():
    optimizer = paper_adam(64, warmup_steps=10, scale=0.5, decay="linear", total_steps=70)
    config = keras.optimizers.serialize(optimizer)["config"]["learning_rate"]
    assert keras.saving.deserialize_keras_object(config).get_config() == {
        "d_model": 64, "warmup_steps": 10, "total_steps": 70, "scale": 0.5}


def traced(schedule):
    """The schedule as the training step reads it: traced once, for any step (a tensor)."""
    function = tf.function(schedule, input_signature=[tf.TensorSpec([], tf.int64)],
                           autograph=False)
    return lambda step: function(tf.constant(step, tf.int64))


def test_the_plan_of_linear_decay_moves_inside_a_traced_step():
    # A time-budgeted run plans its length while it trains: the traced function must see it.
    schedule = LinearDecaySchedule(256, warmup_steps=100, total_steps=5000, scale=1.5)
    rate = traced(schedule)
    assert float(rate(49)) == pytest.approx(linear_formula(50, 256, 100, 5000, 1.5), rel=1e-6)
    schedule.set_plan(1200)
    for step in (50, 650, 1200, 1201):
        assert float(rate(step - 1)) == pytest.approx(
            linear_formula(step, 256, 100, 1200, 1.5), rel=1e-6, abs=1e-12)
    assert schedule.get_config()["total_steps"] == 1200
    # A shorter warm-up at the same peak: the config describes the schedule that now runs.
    schedule.set_plan(300, warmup_steps=25)
    config = schedule.get_config()
    assert (config["warmup_steps"], config["total_steps"]) == (25, 300)
    assert config["scale"] == pytest.approx(1.5 * 0.5)
    rebuilt = LinearDecaySchedule(**config)
    for step in (1, 25, 26, 150, 300, 301):
        expected = linear_formula(step, 256, 25, 300, config["scale"])
        assert float(rate(step - 1)) == pytest.approx(expected, rel=1e-6, abs=1e-12)
        assert float(rebuilt(step - 1)) == pytest.approx(expected, rel=1e-6, abs=1e-12)
    assert linear_formula(25, 256, 25, 300, config["scale"]) == pytest.approx(
        linear_formula(100, 256, 100, 5000, 1.5))  # the peak stayed
    with pytest.raises(ValueError):
        schedule.set_plan(0)


def test_a_plan_shortens_the_rsqrt_warmup_to_the_same_peak_inside_a_traced_step():
    # A time budget that fits fewer updates than the warm-up: the rate must still reach its
    # peak within the run, and then fall as 1/sqrt(step) from there (the formula above with
    # the shorter warm-up and the scale that keeps the peak).
    schedule = NoamSchedule(256, warmup_steps=800, scale=1.5)
    rate = traced(schedule)
    assert float(rate(9)) == pytest.approx(formula(10, 256, 800, 1.5), rel=1e-6)
    schedule.set_plan(500)  # no warm-up given: nothing changes (the decay has no end)
    assert float(rate(599)) == pytest.approx(formula(600, 256, 800, 1.5), rel=1e-6)
    schedule.set_plan(500, warmup_steps=200)
    config = schedule.get_config()
    assert config["warmup_steps"] == 200 and config["scale"] == pytest.approx(1.5 * 0.5)
    rebuilt = NoamSchedule(**config)
    for step in (1, 100, 200, 201, 500, 5000):
        expected = formula(step, 256, 200, config["scale"])
        assert float(rate(step - 1)) == pytest.approx(expected, rel=1e-6)
        assert float(rebuilt(step - 1)) == pytest.approx(expected, rel=1e-6)
    assert formula(200, 256, 200, config["scale"]) == pytest.approx(
        formula(800, 256, 800, 1.5))  # the peak stayed
    assert int(np.argmax([float(rebuilt(i)) for i in range(400)])) == 199  # the 200th update
    with pytest.raises(ValueError):
        schedule.set_plan(0)
