import numpy as np

from tfnmt.copy_task import copy_batch, train_copy_model
from tfnmt.decoding import greedy_decode_uncached
from tfnmt.tokenizer import EOS_ID


def test_tiny_model_learns_to_copy_unseen_inputs():
    model = train_copy_model(steps=800, batch_size=96, vocab_size=16, seed=1)
    source, _, _ = copy_batch(np.random.default_rng(99), 32, 10, 16)  # not seen in training
    output = greedy_decode_uncached(model, source, max_length=12).numpy()
    np.testing.assert_array_equal(output[:, :10], source)
    assert np.all(output[:, 10] == EOS_ID)
