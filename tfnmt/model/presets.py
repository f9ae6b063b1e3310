"""Catalog of model sizes, each with the training settings it is meant to run with.

`cpu` is the main job's model: the best translator found for a short float32 run on a 2-core
CPU (pre-norm, 2+2 layers, no label smoothing; CHANGELOG.md says how it was chosen), trained
for 12.25 minutes. Its dropout (0.1) starts only after 7.5 epochs of the training data: up to
there the model learns faster without it, and a longer run overfits without it
(bench/README.md, "Long runs"). `small` is the 3+3-layer post-norm model of the OpenNMT-tf
speed comparison. `base` and `big` are the paper's (Table 3) with its schedule; `tiny` is for
tests.

    python -m tfnmt.model.presets      # parameter counts with a shared 37,000-token vocabulary
"""
import argparse

# The `Transformer`'s arguments' defaults, readable without TensorFlow: what a saved model that
# omits an argument was built with (tests/test_model.py checks them against its signature).
MODEL_DEFAULTS = dict(vocab_size=None, num_layers=6, d_model=512, num_heads=8, d_ff=2048,
                      dropout=0.1, attention_dropout=0.0, ffn_dropout=0.0, activation="relu",
                      norm_first=False, position="sinusoidal", max_length=1024,
                      share_embeddings=True, tie_output=True, source_vocab_size=None,
                      target_vocab_size=None, num_encoder_layers=None, num_decoder_layers=None,
                      layer_norm_epsilon=1e-6)

PRESETS = {
    "tiny": dict(num_layers=2, d_model=64, num_heads=4, d_ff=128, dropout=0.1),
    "cpu": dict(num_layers=2, d_model=256, num_heads=4, d_ff=1024, dropout=0.1,
                norm_first=True),
    "small": dict(num_layers=3, d_model=256, num_heads=4, d_ff=1024, dropout=0.1),
    "base": dict(num_layers=6, d_model=512, num_heads=8, d_ff=2048, dropout=0.1),
    "big": dict(num_layers=6, d_model=1024, num_heads=16, d_ff=4096, dropout=0.3),
}

# train.py's defaults per preset (flags given on the command line win). batch_tokens is per
# replica and micro-batch; the paper's ~25k-token batches need --accum_steps or replicas.
# train_minutes > 0: the run trains for that long and plans its number of updates from its
# pace (training/budget.py); train_steps is then the length of a run given none (a cluster).
TRAINING = {
    "tiny": dict(lr_decay="rsqrt", batch_tokens=2048, warmup_steps=800, lr_scale=1.0,
                 train_steps=800, eval_every=400, train_minutes=0, label_smoothing=0.1,
                 dropout_from_epoch=0.0),
    # 12.25 minutes of training, as many updates as the CPU does in them: warm-up to a 1.5e-3
    # peak, then linearly to zero at the planned last update; many small updates (1,024-token
    # batches cost a CPU about as much per token as 2,048-token ones); one dev evaluation, at
    # the end. No label smoothing: without it dev perplexity is ~4 lower and test BLEU a little
    # higher at this run's length (bench/README.md). Dropout from epoch 7.5 (its rate is
    # PRESETS["cpu"]["dropout"]): a run that gets there is a long one.
    "cpu": dict(lr_decay="linear", batch_tokens=1024, warmup_steps=800, lr_scale=0.7,
                train_steps=2200, eval_every=0, train_minutes=12.25, label_smoothing=0.0,
                dropout_from_epoch=7.5),
    "small": dict(lr_decay="rsqrt", batch_tokens=4096, warmup_steps=400, lr_scale=0.4,
                  train_steps=1000, eval_every=500, train_minutes=0, label_smoothing=0.1,
                  dropout_from_epoch=0.0),
    "base": dict(lr_decay="rsqrt", batch_tokens=4096, warmup_steps=4000, lr_scale=1.0,
                 train_steps=100000, eval_every=2000, train_minutes=0,
                 label_smoothing=0.1, dropout_from_epoch=0.0),
    "big": dict(lr_decay="rsqrt", batch_tokens=4096, warmup_steps=4000, lr_scale=1.0,
                train_steps=300000, eval_every=2000, train_minutes=0,
                label_smoothing=0.1, dropout_from_epoch=0.0),
}

# Parameter counts the paper reports (Table 3), for comparison.
PAPER_PARAMETERS = {"base": 65e6, "big": 213e6}


def get_preset(name, **overrides):
    """A preset's `Transformer` arguments.

    Args:
      name: a key of PRESETS.
      **overrides: arguments that replace the preset's (None values are ignored).

    Returns:
      A dict of `Transformer` keyword arguments (without the vocabulary size).

    Raises:
      ValueError: an unknown preset.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    settings = dict(PRESETS[name])
    settings.update({k: v for k, v in overrides.items() if v is not None})
    return settings


def check_sizes(model):
    """Raises ValueError for sizes no Transformer can have: an odd d_model (the positions'
    sines and cosines come in pairs) or one that num_heads does not divide.

    Args:
      model: `Transformer` arguments, as `get_preset` returns them.
    """
    d_model, num_heads = model["d_model"], model["num_heads"]
    if d_model % 2:
        raise ValueError(f"d_model={d_model} must be even (positions are sine/cosine pairs)")
    if d_model % num_heads:
        raise ValueError(f"d_model={d_model} must be a multiple of num_heads={num_heads}")


def get_training(name):
    """A preset's training defaults.

    Args:
      name: a key of PRESETS.

    Returns:
      A dict with lr_decay, batch_tokens, warmup_steps, lr_scale, train_steps, eval_every,
      train_minutes and label_smoothing.
    """
    get_preset(name)  # the same error for an unknown name
    return dict(TRAINING[name])


def count_parameters(name, vocab_size=37000, **overrides):
    """The number of trainable weights of a preset.

    Args:
      name: a key of PRESETS.
      vocab_size: the shared vocabulary's size.
      **overrides: as for `get_preset`.

    Returns:
      The count, from a model built on the CPU.
    """
    from tfnmt.model.transformer import Transformer

    model = Transformer(vocab_size=vocab_size, **get_preset(name, **overrides))
    model.build()
    return sum(int(v.numpy().size) for v in model.trainable_variables)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab_size", type=int, default=37000)
    args = parser.parse_args()
    print(f"{'preset':8s} {'parameters':>14s}  paper")
    for name in PRESETS:
        count = count_parameters(name, args.vocab_size)
        paper = PAPER_PARAMETERS.get(name)
        note = f"{paper / 1e6:.0f}M ({(count - paper) / paper:+.1%})" if paper else ""
        print(f"{name:8s} {count:14,d}  {note}")


if __name__ == "__main__":
    main()
