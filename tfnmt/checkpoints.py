"""Loading a trained model from a model_dir: its settings, vocabulary and a checkpoint."""
import json
import os

import tensorflow as tf

from tfnmt.model import Transformer


class ModelDirError(ValueError):
    pass


def resolve_checkpoint(model_dir, which="auto"):
    """'latest', 'averaged', 'auto' (averaged if present, else latest) or a path prefix."""
    if which not in ("auto", "latest", "averaged"):
        if not tf.io.gfile.exists(which + ".index"):
            raise ModelDirError(f"no checkpoint at {which}")
        return which
    averaged = tf.train.latest_checkpoint(os.path.join(model_dir, "averaged")) or \
        _newest_prefix(os.path.join(model_dir, "averaged"))
    latest = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
    path = {"averaged": averaged, "latest": latest, "auto": averaged or latest}[which]
    if not path:
        raise ModelDirError(f"{model_dir} has no {which} checkpoint")
    return path


def _newest_prefix(directory):
    """Averaged checkpoints are written with Checkpoint.write (no state file): newest by step."""
    if not os.path.isdir(directory):
        return None
    prefixes = [f[:-len(".index")] for f in os.listdir(directory) if f.endswith(".index")]
    prefixes.sort(key=lambda p: int(p.rsplit("-", 1)[-1]) if p[-1].isdigit() else -1)
    return os.path.join(directory, prefixes[-1]) if prefixes else None


COMPUTE_DTYPES = {"float32": "float32", "bfloat16": "mixed_bfloat16"}


def load_model(model_dir, which="auto", compute_dtype="float32"):
    """(Transformer with restored float32 weights, SentencePiece model proto, checkpoint path).

    compute_dtype "bfloat16" runs its matmuls in bfloat16 (softmax, LayerNorm and logits stay
    float32, as in training): faster where bf16 is native (AVX512-BF16/AMX CPUs, GPUs of
    compute capability >= 8.0), very slow where it is emulated."""
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be one of {sorted(COMPUTE_DTYPES)}, "
                         f"got {compute_dtype!r}")
    settings_path = os.path.join(model_dir, "settings.json")
    if not os.path.exists(settings_path):
        raise ModelDirError(f"{model_dir} holds no trained model (no settings.json)")
    with open(settings_path) as f:
        settings = json.load(f)
    with open(os.path.join(model_dir, "spm.model"), "rb") as f:
        proto = f.read()
    path = resolve_checkpoint(model_dir, which)
    # Variables are float32 whatever the compute dtype (as in mixed-precision training).
    model = Transformer(**settings["model"], dtype=COMPUTE_DTYPES[compute_dtype])
    model.build()
    tf.train.Checkpoint(model=model).read(path).expect_partial().assert_existing_objects_matched()
    return model, proto, path

