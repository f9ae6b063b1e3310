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
