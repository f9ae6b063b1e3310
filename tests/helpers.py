"""Small builders shared by the tests."""
import keras
import numpy as np


def assert_config_round_trip(layer, *call_args, **call_kwargs):
    """from_config(get_config()) gives an equal config, and with copied weights equal outputs."""
    config = layer.get_config()
    clone = layer.__class__.from_config(config)
    assert clone.get_config() == config
    expected = layer(*call_args, **call_kwargs)
    clone(*call_args, **call_kwargs)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(clone(*call_args, **call_kwargs), expected, atol=1e-6)
    # Through Keras' own (de)serialisation too: checks the tfnmt registration.
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is type(layer) and restored.get_config() == config


def random_ids(rng, batch, length, vocab_size, low=4):
    return rng.integers(low, vocab_size, size=(batch, length)).astype("int32")
