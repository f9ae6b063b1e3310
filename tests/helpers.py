"""Small builders shared by the tests."""
import os
import subprocess
import sys

import keras
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python(script, *args, env=None, timeout=300, cwd=ROOT):
    """Runs one of the entry points (train.py, export.py, ...) in a fresh process."""
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    return subprocess.run([sys.executable, os.path.join(ROOT, script), *args], cwd=cwd,
                          env=environment, timeout=timeout, capture_output=True, text=True)


def train_flags(small_corpus, train_data, model_dir, **overrides):
    """train.py's command line for a tiny run on the small corpus (train_data: its prepared
    records, or None to prepare them in the model_dir)."""
    flags = {"model_dir": model_dir, "dataset": "files", "train_files": small_corpus["train"],
             "dev_files": small_corpus["dev"], "data_dir": train_data, "vocab_size": 600,
             "preset": "tiny", "batch_tokens": 512, "max_length": 64, "train_steps": 12,
             "warmup_steps": 5, "log_every": 4, "checkpoint_every": 4, "eval_every": 8,
             "bleu_sentences": 8, "average_last": 3}
    flags.update(overrides)
    return ["train.py"] + [f"--{k}={v}" for k, v in flags.items() if v is not None]


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
