"""The Annotated Transformer's "first example": learn to copy a random symbol sequence.

    python -m tfnmt.copy_task          # trains a tiny model on CPU and decodes a few new inputs
"""
import argparse
import time

import keras
import numpy as np
import tensorflow as tf

from tfnmt.data.special_tokens import BOS_ID, EOS_ID
from tfnmt.inference.decoding import greedy_decode_uncached
from tfnmt.model.presets import get_preset
from tfnmt.model.transformer import Transformer
from tfnmt.training.losses import masked_loss_sum
from tfnmt.training.schedule import paper_adam

FIRST_SYMBOL = EOS_ID + 1  # symbols are drawn from [FIRST_SYMBOL, vocab_size)


def copy_batch(rng, batch_size, length, vocab_size):
    """A random copy-task batch.

    Args:
      rng: a numpy Generator.
      batch_size, length: B, L.
      vocab_size: the tokens drawn from (above the special ones).

    Returns:
      (source [B, L], decoder input [B, L + 1] = BOS + source, labels [B, L + 1] = source + EOS).
    """
    source = rng.integers(FIRST_SYMBOL, vocab_size, size=(batch_size, length), dtype=np.int32)
    column = np.ones((batch_size, 1), np.int32)
    return (source, np.concatenate([column * BOS_ID, source], 1),
            np.concatenate([source, column * EOS_ID], 1))


def train_copy_model(steps=300, batch_size=96, length=10, vocab_size=16, seed=1,
                     log_every=0):
    """Trains the tiny preset (pre-norm, no dropout) on fresh random batches. With the defaults it
    learns to copy unseen sequences (tests/test_copy_task.py checks it); the tiny post-norm model
    needs more steps for the same result.

    Args:
      steps: updates.
      batch_size, length, vocab_size: as for `copy_batch`.
      seed: the random seed.
      log_every: print the loss every this many steps (0: never).

    Returns:
      The trained `Transformer`.
    """
    keras.utils.set_random_seed(seed)  # Python, NumPy, TF and Keras initialisers
    rng = np.random.default_rng(seed)
    model = Transformer(vocab_size=vocab_size, **get_preset("tiny", dropout=0.0, norm_first=True))
    model.build()
    # Decaying to zero: Adam's loss spikes at a constant rate near zero loss would leave a
    # few wrong tokens if one came in the last steps.
    optimizer = paper_adam(model.d_model, warmup_steps=100, scale=1.0, decay="linear",
                           total_steps=steps)

    @tf.function(reduce_retracing=True, autograph=False)
    def train_step(source, target_in, labels):
        with tf.GradientTape() as tape:
            logits = model((source, target_in), training=True)
            loss_sum, tokens = masked_loss_sum(labels, logits, epsilon=0.0)
            loss = loss_sum / tokens
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for step in range(1, steps + 1):
        loss = train_step(*copy_batch(rng, batch_size, length, vocab_size))
        if log_every and step % log_every == 0:
            print(f"step {step:5d}  loss {float(loss):.4f}")
    return model


def main():
    start = time.time()
    model = train_copy_model(log_every=50)
    source, _, _ = copy_batch(np.random.default_rng(1234), 4, 10, 16)
    output = greedy_decode_uncached(model, source, max_length=11).numpy()
    for src, out in zip(source, output):
        print("source:", src.tolist(), "\noutput:", out.tolist())
    print(f"{time.time() - start:.1f}s")


if __name__ == "__main__":
    # No options: --help says what it does, and an unknown argument is refused, not ignored.
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    main()
