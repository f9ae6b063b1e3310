import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import run_layer_test
from tfnmt.layers import LayerNorm


def _pair(dim=16, dtype=None):
    """A LayerNorm and a keras.layers.LayerNormalization with the same non-trivial γ and β."""
    ours = LayerNorm(epsilon=1e-6, dtype=dtype)
    reference = keras.layers.LayerNormalization(epsilon=1e-6, dtype=dtype)
    ours.build((None, dim))
    reference.build((None, dim))
    rng = np.random.default_rng(0)
    weights = [rng.normal(1.0, 0.3, dim).astype("float32"),
               rng.normal(0, 0.3, dim).astype("float32")]
    ours.set_weights(weights)
    reference.set_weights(weights)
    return ours, reference


def _values_and_gradients(layer, x, upstream, training=None):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=training)
        total = tf.reduce_sum(tf.cast(y, tf.float32) * upstream)
    return [y] + tape.gradient(total, [x] + layer.trainable_variables)


@pytest.mark.parametrize("training", [True, False])
def test_values_and_gradients_match_keras(training):
    """Training: the closed-form gradient; otherwise tf.nn.moments + batch_normalization."""
    ours, reference = _pair()
    x = tf.random.normal([3, 5, 16]) * 4.0 + 2.0
    upstream = tf.random.normal([3, 5, 16])
    got = _values_and_gradients(ours, x, upstream, training)
    expected = _values_and_gradients(reference, x, upstream)
    for name, a, b in zip(["y", "dx", "dgamma", "dbeta"], got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=name)


def test_inference_matches_float64_and_gives_the_same_bits_in_a_graph():
    # A graph must not round differently from eager code: under bf16 matmuls a last-bit
    # difference flips the rounding of the next product's input (layer_norm.py).
    ours, _ = _pair(dim=256)
    x = tf.random.normal([4, 40, 256]) * 3.0 + 1.0
    eager = ours(x)
    graph = tf.function(ours, input_signature=[tf.TensorSpec([None, None, 256])])(x)
    np.testing.assert_array_equal(graph, eager)
    x64 = x.numpy().astype(np.float64)
    centred = x64 - x64.mean(axis=-1, keepdims=True)
    expected = (centred / np.sqrt((centred ** 2).mean(axis=-1, keepdims=True) + ours.epsilon)
                * ours.gamma.numpy() + ours.beta.numpy())
    np.testing.assert_allclose(eager, expected, rtol=1e-5, atol=2e-6)


def test_mixed_bfloat16_normalises_in_float32():
    ours, reference = _pair(dtype="mixed_bfloat16")
    # Large mean, small spread: a bfloat16 mean/variance would lose the spread entirely.
    x = tf.cast(300.0 + tf.random.normal([4, 16]), tf.float32)
    for training in (True, False):
        y = ours(x, training=training)
        assert y.dtype == tf.bfloat16 and ours.gamma.dtype == "float32"
        np.testing.assert_allclose(tf.cast(y, tf.float32), tf.cast(reference(x), tf.float32),
                                   atol=0.05)
    upstream = tf.random.normal([4, 16])
    got = _values_and_gradients(ours, x, upstream, training=True)
    expected = _values_and_gradients(reference, x, upstream)
    for a, b in zip(got[1:], expected[1:]):
        np.testing.assert_allclose(tf.cast(a, tf.float32), tf.cast(b, tf.float32), rtol=0.05,
                                   atol=0.05)


def test_reads_checkpoints_of_keras_layer_normalization(tmp_path):
    """Same variable names (gamma, beta): models trained before the switch still restore."""
    ours, reference = _pair()
    reference.gamma.assign(tf.fill([16], 2.5))
    reference.beta.assign(tf.fill([16], -1.0))
    path = tf.train.Checkpoint(norm=reference).write(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(norm=ours).read(path).assert_existing_objects_matched()
    np.testing.assert_array_equal(ours.gamma.numpy(), 2.5)
    np.testing.assert_array_equal(ours.beta.numpy(), -1.0)


@pytest.mark.parametrize("shape", [[7, 16], [2, 3, 16], [0, 16]])
def test_shapes(shape):
    ours, reference = _pair()
    x = tf.random.normal(shape)
    np.testing.assert_allclose(ours(x, training=True), reference(x), atol=1e-5)
    np.testing.assert_allclose(ours(x), reference(x), atol=1e-5)


def test_layer_contract():
    run_layer_test(LayerNorm, dict(epsilon=1e-3), (tf.random.normal([2, 3, 8]),),
                   expected_weights=2, expected_parameters=2 * 8)


@pytest.mark.parametrize("norm_first", [False, True])
def test_training_reaches_every_layer_norm_of_the_model(monkeypatch, norm_first):
    """The training loop calls model.encode / decoder_states directly (not model.__call__):
    training=True must still reach each LayerNorm, or it falls back to the slower Keras ops."""
    from tfnmt.layers import layer_norm as module
    from tfnmt.model.presets import get_preset
    from tfnmt.model.transformer import Transformer

    calls = []
    original = module.layer_norm
    monkeypatch.setattr(module, "layer_norm", lambda *a, **k: calls.append(1) or original(*a, **k))
    model = Transformer(vocab_size=30, norm_first=norm_first, **get_preset("tiny"))
    memory, padding = model.encode(tf.constant([[5, 6, 3]]), training=True)
    model.decoder_states(tf.constant([[2, 7]]), memory, padding, training=True)
    expected = 2 * 2 + 2 * 3 + (2 if norm_first else 0)  # 2 encoder, 2 decoder layers (+ final)
    assert len(calls) == expected
    calls.clear()
    model.encode(tf.constant([[5, 6, 3]]))
    assert not calls
