"""Starting a run from another run's weights (`train.py --init_from`): fine-tuning on new data,
domain adaptation, or continuing a model under new training settings in a new model_dir.

The new run takes the source's model and vocabulary (its data is tokenized with the source's
SentencePiece model), and either a fresh optimizer (Adam's moments at zero, the learning-rate
schedule from step 0, warm-up included) or the source's optimizer state (moments and step
count, so the schedule goes on where it was).
"""
import os

import tensorflow as tf

from tfnmt.checkpoints import candidate_checkpoints, newest_readable_checkpoint
from tfnmt.data import vocabulary
from tfnmt.paths import CHECKPOINTS, SETTINGS, read_settings
from tfnmt.training.settings import DATA_DEFAULTS_BEFORE, SettingsError, model_defaults

# Model settings a fine-tuning run may change: they create no variables.
CHANGEABLE_MODEL = ("dropout", "attention_dropout", "ffn_dropout")
# Data settings that define the vocabulary: the source's.
VOCABULARY = ("vocab_size", "vocab_type", "separate_vocabularies")


def resolve_source(path, optimizer=False):
    """The run and checkpoint a new run starts from.

    Args:
      path: a model_dir `train.py` wrote, or a checkpoint prefix inside one
        (`<model_dir>/{checkpoints,best,averaged}/ckpt-N`).
      optimizer: whether the optimizer's state is wanted too (then a model_dir gives its newest
        readable training checkpoint; averaged and best checkpoints hold weights only).

    Returns:
      {"model_dir", "checkpoint", "optimizer"}.

    Raises:
      SettingsError: nothing usable at `path` (one line).
    """
    is_prefix = tf.io.gfile.exists(path + ".index")
    if is_prefix:
        model_dir = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    elif os.path.isdir(path):
        model_dir = path
    else:
        raise SettingsError(f"--init_from={path}: neither a model_dir nor a checkpoint prefix")
    separate = ((read_settings(model_dir) or {}).get("data") or {}).get("separate_vocabularies",
                                                                          False)
    for name in [SETTINGS] + sorted(set(vocabulary.file_names(separate).values())):
        if not os.path.exists(os.path.join(model_dir, name)):
            raise SettingsError(f"--init_from={path}: {model_dir} has no {name}; give a "
                                "model_dir train.py wrote, or a checkpoint inside one")
    if is_prefix:
        checkpoint = path
    elif optimizer:
        checkpoint = newest_readable_checkpoint(os.path.join(path, CHECKPOINTS))
    else:
        checkpoint = next((p for p in _safe_candidates(path) if _readable(p)), None)
    if checkpoint is None:
        raise SettingsError(f"--init_from={path}: no checkpoint there reads back")
    if optimizer and not any(key.startswith("optimizer/") for key in
                             tf.train.load_checkpoint(checkpoint).get_variable_to_shape_map()):
        raise SettingsError(f"--init_optimizer: {checkpoint} holds weights only; give a "
                            f"checkpoint of {os.path.join(model_dir, CHECKPOINTS)}")
    return {"model_dir": model_dir, "checkpoint": checkpoint, "optimizer": bool(optimizer)}


def _safe_candidates(model_dir):
    try:
        return candidate_checkpoints(model_dir, "auto")
    except ValueError:
        return []


def _readable(prefix):
    try:
        tf.train.load_checkpoint(prefix)
        return True
    except (tf.errors.OpError, ValueError):
        return False


def apply_source(settings, explicit, source):
    """Makes a new run's settings those of a run started from `source`: the source's model
    (but for `CHANGEABLE_MODEL` given explicitly), vocabulary settings and direction (unless
    --reverse is given).

    Args:
      settings: the requested settings (from flags); changed in place.
      explicit: the "section.key" names given on the command line.
      source: `resolve_source`'s result; recorded as settings["init_from"].

    Returns:
      `settings`.

    Raises:
      SettingsError: an explicit model flag differs from the source's model.
    """
    saved = read_settings(source["model_dir"])
    model = dict(saved["model"])
    # Settings hold what differs from the Transformer's defaults: compare with those filled in.
    source_model = dict(model_defaults(), **model)
    # Sinusoidal positions exist at any length; learned ones are a table of max_length rows.
    changeable = CHANGEABLE_MODEL + (("max_length",) if source_model["position"] != "learned"
                                     else ())
    data = dict(DATA_DEFAULTS_BEFORE, **saved["data"])
    conflicts = [f"{key}={settings['data'][key]!r} (source: {data[key]!r})" for key in VOCABULARY
                 if f"data.{key}" in explicit and settings["data"][key] != data[key]]
    if conflicts:
        raise SettingsError(f"--init_from: the source's vocabulary differs: "
                            f"{', '.join(conflicts)}; a fine-tuned model keeps it")
    conflicts = [f"{key}={value!r} (source: {source_model.get(key)!r})"
                 for key, value in settings["model"].items()
                 if f"model.{key}" in explicit and key not in changeable
                 and source_model.get(key) != value]
    if conflicts:
        raise SettingsError(f"--init_from: the source model differs: {', '.join(conflicts)}; "
                            "a fine-tuned model keeps its source's shape")
    for key in changeable:
        if f"model.{key}" in explicit:
            model[key] = settings["model"][key]
    settings["model"] = model
    settings["data"].update({key: data[key] for key in VOCABULARY})
    # The training pairs fit the model's positions: the source's unless --max_length is given.
    settings["data"]["max_length"] = dict(model_defaults(), **model)["max_length"]
    if "data.reverse" not in explicit:  # it goes on translating as its source did
        settings["data"]["reverse"] = data["reverse"]
    settings["init_from"] = source
    return settings


def initialize(model, optimizer, source):
    """Reads the source checkpoint into a new run's model (and optimizer).

    Args:
      model: the built `Transformer`.
      optimizer: its built optimizer.
      source: settings["init_from"].

    Returns:
      The optimizer's update count afterwards (0 with a fresh optimizer).

    Raises:
      SettingsError: the checkpoint does not fit the model (or holds no optimizer state).
    """
    objects = {"model": model, "optimizer": optimizer} if source["optimizer"] else {"model": model}
    try:
        tf.train.Checkpoint(**objects).read(source["checkpoint"]).expect_partial() \
            .assert_existing_objects_matched()
    except (tf.errors.OpError, AssertionError, ValueError) as error:
        raise SettingsError(f"--init_from: {source['checkpoint']} does not read into this model "
                            f"({str(error).splitlines()[0][:200]})") from None
    return int(optimizer.iterations.numpy())
