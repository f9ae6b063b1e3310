import numpy as np
import pytest
import tensorflow as tf

from helpers import run_layer_test
from tfnmt.layers import FeedForward


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_matches_formula(activation):
    layer = FeedForward(8, 32, activation=activation)
    x = tf.random.normal([2, 3, 8])
    out = layer(x)
    w = {v.name: v.numpy() for v in layer.weights}
    h = x.numpy() @ w["inner_kernel"] + w["inner_bias"]
    h = np.maximum(h, 0) if activation == "relu" else tf.nn.gelu(h).numpy()
    np.testing.assert_allclose(out, h @ w["output_kernel"] + w["output_bias"], atol=1e-5)


def test_unknown_activation_is_refused():
    with pytest.raises(ValueError, match="activation"):
        FeedForward(8, 32, activation="swish")


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_layer_contract(activation):
    run_layer_test(FeedForward, dict(d_model=8, d_ff=16, activation=activation,
                                     inner_dropout=0.1),
                   (tf.random.normal([2, 3, 8]),), expected_weights=4,
                   expected_parameters=8 * 16 + 16 + 16 * 8 + 8)


def test_inner_dropout_drops_inner_activations_in_training_only():
    # With an invertible output kernel the inner activations are recovered from the output:
    # in training each is ReLU(x W1 + b1) / keep probability or 0; elsewhere none is dropped.
    rate = 0.5
    layer = FeedForward(8, 8, inner_dropout=rate)
    x = tf.random.normal([64, 4, 8], seed=1)
    layer(x)
    w = {v.name: v.numpy().astype(np.float64) for v in layer.weights}
    inner = np.maximum(x.numpy() @ w["inner_kernel"] + w["inner_bias"], 0)  # [B, T, F]

    def recovered(out):
        return np.linalg.solve(w["output_kernel"].T,
                               (out.numpy() - w["output_bias"]).reshape(-1, 8).T).T

    np.testing.assert_allclose(recovered(layer(x)), inner.reshape(-1, 8), atol=1e-4)
    got = recovered(layer(x, training=True))
    kept = np.isclose(got, inner.reshape(-1, 8) / (1 - rate), atol=1e-4)
    dropped = np.isclose(got, 0, atol=1e-4)
    assert np.all(kept | dropped)
    active = inner.reshape(-1, 8) > 1e-2  # where kept and dropped differ
    assert 0.4 < dropped[active].mean() < 0.6
