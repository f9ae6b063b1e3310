"""A run's settings: saved in <model_dir>/settings.json, and which of them a resumed run
must keep."""
import inspect
import json
import os

from tfnmt.checkpoints import checkpoint_prefixes
from tfnmt.model.transformer import Transformer
from tfnmt.paths import SETTINGS

# Settings a run in an existing model_dir must share with it: every model and training setting
# but those meant to change on resume, and the data that defines the vocabulary.
FIXED_DATA = ("dataset", "files", "vocab_size", "vocab_type")
RESUMABLE_TRAIN = ("train_steps", "log_every", "eval_every", "bleu_sentences",
                   "checkpoint_every", "keep_checkpoints", "average_last", "jit_compile",
                   "mixed_precision")


class SettingsError(ValueError):
    """Settings that cannot run in this model_dir (raised before any work)."""


def load_settings(model_dir):
    """The settings saved in `model_dir`, or None where there are none."""
    path = os.path.join(model_dir, SETTINGS)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


MODEL_DEFAULTS = {name: parameter.default for name, parameter
                  in inspect.signature(Transformer.__init__).parameters.items()
                  if parameter.default is not inspect.Parameter.empty and name != "dtype"}


def is_fixed(section, key):
    """Whether a resumed run must keep this setting (section "model", "data" or "train")."""
    return (section == "model" or (section == "data" and key in FIXED_DATA)
            or (section == "train" and key not in RESUMABLE_TRAIN))


def _fp16_switch(name, new, old):
    # fp16 adds loss-scale state to the checkpoints: a switch to or from it cannot resume.
    return name == "train.mixed_precision" and new != old and "fp16" in (new, old)


def resolve_settings(requested, explicit, model_dir):
    """Settings for this run: `requested` (from flags), where the flags not given explicitly
    (`explicit`: set of "section.key") take the values saved in model_dir. An explicit value
    that changes a fixed saved setting (`is_fixed`; a setting the saved file does not record
    counts as changed) is an error, raised before any work, as are checkpoints without a
    saved settings file (nothing could tell whether they fit these settings)."""
    saved = load_settings(model_dir)
    if saved is None:
        if checkpoint_prefixes(os.path.join(model_dir, "checkpoints")):
            raise SettingsError(f"{model_dir} holds checkpoints but no {SETTINGS}: nothing says "
                                "which model they hold. Restore the file or use a new "
                                "--model_dir.")
        return requested
    resolved = json.loads(json.dumps(requested))
    conflicts = []
    for section in ("model", "data", "train"):
        ours, theirs = resolved.setdefault(section, {}), saved.get(section) or {}
        if section == "model":  # the saved model was built with the defaults of what it omits
            theirs = dict(MODEL_DEFAULTS, **theirs)
        for key in sorted(set(ours) | set(theirs)):
            name = f"{section}.{key}"
            if name not in explicit:
                if key in theirs:
                    ours[key] = theirs[key]
            elif (is_fixed(section, key) or _fp16_switch(name, ours.get(key), theirs.get(key))) \
                    and (key not in theirs or ours.get(key) != theirs[key]):
                before = repr(theirs[key]) if key in theirs else "not recorded"
                conflicts.append(f"{key}={ours.get(key)!r} (saved: {before})")
    if conflicts:
        raise SettingsError(f"{model_dir} holds a run with other settings: "
                            f"{', '.join(conflicts)}. Use a new --model_dir, or drop these flags "
                            "to continue the saved run.")
    return resolved


def write_json(path, value):
    """Writes `value` as JSON to `path` atomically (the old file or the new one, never half)."""
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
