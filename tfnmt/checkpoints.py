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


def load_model(model_dir, which="auto"):
    """(float32 Transformer with restored weights, SentencePiece model proto, checkpoint path).
    Inference in bfloat16 is chosen where the model is used (serving.TranslationModule's
    matmul_dtype)."""
    settings_path = os.path.join(model_dir, "settings.json")
    if not os.path.exists(settings_path):
        raise ModelDirError(f"{model_dir} holds no trained model (no settings.json)")
    with open(settings_path) as f:
        settings = json.load(f)
    with open(os.path.join(model_dir, "spm.model"), "rb") as f:
        proto = f.read()
    path = resolve_checkpoint(model_dir, which)
    model = Transformer(**settings["model"], dtype="float32")
    model.build()
    tf.train.Checkpoint(model=model).read(path).expect_partial().assert_existing_objects_matched()
    return model, proto, path

