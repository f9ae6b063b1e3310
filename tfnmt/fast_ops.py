"""One switch for tfnmt's hand-written speed-ups.

A few stock ops are replaced by faster ones of tfnmt's own, each tested against the stock
version (CHANGELOG.md, "Measured gains of the speed-ups", says what each bought):

  layers/linear.py      every projection as one 2-D GEMM with the bias gradient as a GEMM;
                        bfloat16 weight products at inference (`low_precision_matmuls`)
  layers/layer_norm.py  LayerNorm with a closed-form gradient
  layers/dropout.py     dropout masks from 16 random bits per element
  losses.py             the smoothed cross-entropy with its own gradient; in training
                        (training.Trainer) the output projection inside it
  decoding.py           the top-k log-probabilities of a search step without a full
                        log-softmax
  distribute.py         Adam's update as TensorFlow's fused ResourceApplyAdam kernel
                        (PreReducedAdam.update_step)

`plain_ops()` (a context manager), `set_plain_ops(True)`, TFNMT_PLAIN_OPS=1 or
`train.py --plain_ops` turn them all off: the layers, loss and searches then run stock
TensorFlow ops that autodiff differentiates (tf.matmul, tf.nn.moments +
tf.nn.batch_normalization, tf.nn.experimental.stateless_dropout, log_softmax + top_k), Adam is
Keras' update, and training computes `Transformer.call`, then the loss. Results agree up to
rounding (dropout draws other masks). The switch is read when a function is traced, so set it
before.
"""
import contextlib
import os

_plain = [os.environ.get("TFNMT_PLAIN_OPS", "0") not in ("", "0")]


def enabled():
    """True while the fast ops are in use (the default)."""
    return not _plain[0]


def set_plain_ops(plain):
    """Chooses stock or fast ops for the rest of the process.

    Args:
      plain: True for stock ops everywhere, False for the fast ones.
    """
    _plain[0] = bool(plain)


@contextlib.contextmanager
def plain_ops(plain=True):
    """A scope with stock ops (or the fast ones).

    Args:
      plain: True for stock ops within the scope, False for the fast ones.

    Example:
      with fast_ops.plain_ops():
          loss = trainer.train_step(iterator)  # autodiff through stock TensorFlow ops
    """
    previous = _plain[0]
    _plain[0] = bool(plain)
    try:
        yield
    finally:
        _plain[0] = previous
