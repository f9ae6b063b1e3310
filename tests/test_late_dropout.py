import math

import numpy as np
import pytest
import tensorflow as tf

from tfnmt.model.presets import get_preset
from tfnmt.model.transformer import Transformer
from tfnmt.training.late_dropout import DropoutStart


class Layer:
    rate = 0.3


def feed(start, tokens, first=0):
    """Steps a DropoutStart with each update's target tokens; -> the steps where it started."""
    started = []
    for step, count in enumerate(tokens, start=first + 1):
        if start.update(step, count):
            started.append(step)
    return started


def test_dropout_starts_at_the_epoch_measured_from_the_first_updates():
    rng = np.random.default_rng(0)
    tokens = rng.integers(300, 700, size=400).astype(float)
    layers = [Layer(), Layer()]
    start = DropoutStart(layers, rate=0.1, epochs=2.5, epoch_tokens=40_000, first_step=0,
                         measure_steps=100)
    assert [layer.rate for layer in layers] == [0.0, 0.0]
    started = feed(start, tokens)
    # 2.5 epochs at the mean target tokens per update of the first 100 updates.
    expected = math.ceil(2.5 * 40_000 / tokens[:100].mean())
    assert start.start_step == expected and started == [expected]
    assert [layer.rate for layer in layers] == [0.1, 0.1]


def test_a_resumed_run_starts_at_the_saved_update():
    before = [Layer()]
    start = DropoutStart(before, 0.1, 5.0, 10_000, first_step=120, start_step=150)
    assert before[0].rate == 0.0
    assert feed(start, [500.0] * 60, first=120) == [150]  # not measured again
    after = [Layer()]
    DropoutStart(after, 0.1, 5.0, 10_000, first_step=150, start_step=150)
    assert after[0].rate == 0.1  # on from the resumed run's first update


def test_a_run_resumed_before_the_measurement_measures_its_own_updates():
    start = DropoutStart([Layer()], 0.1, 2.0, 20_000, first_step=40, measure_steps=100)
    assert feed(start, [250.0] * 100, first=40) == [] and start.start_step == 40 + 160
    assert feed(start, [250.0] * 100, first=140) == [200]


def test_a_start_inside_the_measurement_comes_at_its_end():
    layer = Layer()
    start = DropoutStart([layer], 0.1, 0.5, 20_000, first_step=0, measure_steps=100)
    # 0.5 epochs are 10,000 tokens: 40 updates of 250, passed while the first 100 measured
    # them. Dropout starts at the measurement's end, and that update is the one saved.
    assert feed(start, [250.0] * 120) == [100]
    assert (start.epoch_step, start.start_step) == (40, 100)
    assert layer.rate == 0.1
    resumed = DropoutStart([Layer()], 0.1, 0.5, 20_000, first_step=90,
                           start_step=start.start_step)
    assert feed(resumed, [250.0] * 20, first=90) == [100]  # a resumed run starts it there too


@pytest.mark.parametrize("values", [(0.0, 1.0, 10.0), (0.1, 0.0, 10.0), (0.1, 1.0, 0.0)])
def test_it_needs_a_rate_epochs_and_tokens(values):
    with pytest.raises(ValueError):
        DropoutStart([Layer()], *values, first_step=0)


def test_the_model_drops_only_once_started():
    model = Transformer(vocab_size=40, **get_preset("tiny", dropout=0.5))
    source = tf.constant([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]])
    target = tf.constant([[1, 11, 12, 2], [1, 13, 2, 0]])
    model((source, target))
    layers = model.residual_dropouts()
    assert len(layers) == 1 + 2 * 2  # embeddings, then each encoder and decoder layer's
    step = tf.function(lambda: model((source, target), training=True))
    start = DropoutStart(layers, 0.5, 1.0, 100, first_step=0, start_step=1)
    inference = model((source, target), training=False)
    np.testing.assert_allclose(step(), inference, rtol=1e-5, atol=1e-5)  # no dropout yet
    assert start.update(1, 50.0)
    step = tf.function(lambda: model((source, target), training=True))  # traced again
    assert np.abs(step().numpy() - inference.numpy()).max() > 1e-2
