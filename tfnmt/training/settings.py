"""A run's settings: saved in <model_dir>/settings.json, and which of them a resumed run
must keep."""
import json
import os
import shlex

from tfnmt.data.corpus import train_specs
from tfnmt.model.presets import MODEL_DEFAULTS
from tfnmt.paths import (CHECKPOINTS, SETTINGS, DamagedFileError, checkpoint_prefixes,
                         read_settings, write_atomically)

# Settings a run in an existing model_dir must share with it: every model and training setting
# but those meant to change on resume, and the data that defines the vocabulary.
FIXED_DATA = ("dataset", "files", "vocab", "vocab_size", "vocab_type", "separate_vocabularies",
              "reverse")
RESUMABLE_TRAIN = ("train_steps", "train_minutes", "log_every", "eval_every", "bleu_sentences",
                   "checkpoint_every", "keep_checkpoints", "average_last", "jit_compile",
                   "mixed_precision", "best_metric", "bleu_tokenize", "early_stopping",
                   "eval_beam_size", "clip_norm", "subword_alpha", "subword_nbest")


class SettingsError(ValueError):
    """Settings that cannot run in this model_dir (raised before any work)."""


def model_defaults():
    """The `Transformer` arguments' defaults: what a saved model omitting them was built with."""
    return dict(MODEL_DEFAULTS)


# What a saved run that does not record these settings trained with.
TRAIN_DEFAULTS_BEFORE = {"lr_decay": "rsqrt", "train_minutes": 0.0, "dropout_from_epoch": 0.0}
DATA_DEFAULTS_BEFORE = {"separate_vocabularies": False, "reverse": False, "vocab": None}


def is_fixed(section, key):
    """Whether a resumed run must keep a setting.

    Args:
      section: "model", "data" or "train".
      key: the setting's name.

    Returns:
      True for every model setting, the data settings that define the vocabulary, and the
      training settings not in RESUMABLE_TRAIN.
    """
    return (section == "model" or (section == "data" and key in FIXED_DATA)
            or (section == "train" and key not in RESUMABLE_TRAIN))


def _fp16_switch(name, new, old):
    # fp16 adds loss-scale state to the checkpoints: a switch to or from it cannot resume.
    return name == "train.mixed_precision" and new != old and "fp16" in (new, old)


def _replanned_budget(ours, theirs, explicit, model_dir):
    """A new --train_minutes for a run that has trained: its number of updates was planned
    from the budget it started with (and its learning rate decays to zero there), so another
    budget cannot apply to it."""
    minutes = ours.get("train_minutes")
    if "train.train_minutes" not in explicit or not minutes \
            or minutes == theirs.get("train_minutes", 0.0) \
            or not checkpoint_prefixes(os.path.join(model_dir, CHECKPOINTS)):
        return []
    return [f"train_minutes={minutes!r} (saved: {theirs.get('train_minutes', 0.0)!r}, planned "
            f"as train_steps={theirs.get('train_steps')!r}; a time budget plans a new run, "
            "--train_steps trains this one further)"]


def _kept_vocabulary(given, model_dir):
    """Whether the SentencePiece models given (train.py --vocab) are, byte for byte, those the
    run keeps in model_dir: the same models at another path (moved or copied since)."""
    from tfnmt.data import vocabulary

    if not given or len(given) > 2:
        return False
    copies = vocabulary.paths(model_dir, separate=len(given) == 2)
    try:
        return all(_read(path) == _read(copy)
                   for path, copy in zip(given * 2 if len(given) == 1 else given, copies))
    except OSError:
        return False


def _moved_corpus(given, saved, data_dir):
    """Whether the corpus files given (train.py --train_files, --dev_files, --test_files) are
    those the run's data was prepared from, at other paths (moved or copied since): the same
    splits and files per corpus, each file with the sha256 the prepared data's manifest
    recorded."""
    from tfnmt.data import records

    def layout(files):
        return {split: [(spec or "").count(",") for spec in train_specs({"train": specs})]
                for split, specs in (files or {}).items()}

    if not given or not saved or layout(given) != layout(saved):
        return False
    try:
        manifest = records.load_manifest(data_dir, check_shards=False)
    except records.PreparedDataError:
        return False
    return records.moved_corpus(manifest, given)


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def resolve_settings(requested, explicit, model_dir):
    """The settings of this run: `requested` (from flags), where the flags not given explicitly take
    the values saved in model_dir.

    Args:
      requested: {"model_dir", "model", "data", "train"} from the flags.
      explicit: the set of "section.key" given on the command line, and "data.files.<split>"
        for each split whose files were given (a split left out keeps its saved files).
      model_dir: the run's directory.

    Returns:
      The resolved settings.

    Raises:
      SettingsError: an explicit value changes a fixed saved setting (`is_fixed`; a setting the
        saved file does not record counts as changed), a new --train_minutes is given for a run
        that has checkpoints, or model_dir holds checkpoints without a settings file (nothing
        could tell whether they fit). Raised before any work.
      DamagedFileError: the saved model settings name a setting no Transformer takes.
    """
    saved = read_settings(model_dir)
    if saved is None:
        if checkpoint_prefixes(os.path.join(model_dir, CHECKPOINTS)):
            raise SettingsError(f"{model_dir} holds checkpoints but no {SETTINGS}: nothing says "
                                "which model they hold. Restore the file or use a new "
                                "--model_dir.")
        return requested
    unknown = sorted(set(saved.get("model") or {}) - set(model_defaults()))
    if unknown:  # edited by hand, or written by another version of tfnmt
        raise DamagedFileError(f"{os.path.join(model_dir, SETTINGS)} holds model settings no "
                               f"Transformer takes ({', '.join(unknown)}): restore it as "
                               "train.py wrote it, or use another --model_dir")
    resolved = json.loads(json.dumps(requested))
    conflicts = []
    for section in ("model", "data", "train"):
        ours, theirs = resolved.setdefault(section, {}), saved.get(section) or {}
        if section == "model":  # the saved model was built with the defaults of what it omits
            theirs = dict(model_defaults(), **theirs)
        elif section == "train":  # runs saved before a setting existed trained without it
            theirs = dict(TRAIN_DEFAULTS_BEFORE, **theirs)
        else:
            theirs = dict(DATA_DEFAULTS_BEFORE, **theirs)
        for key in sorted(set(ours) | set(theirs)):
            name = f"{section}.{key}"
            if name == "data.files" and name in explicit and theirs.get(key):
                # A split whose files flag is left out keeps its saved files.
                ours[key] = dict({split: files for split, files in theirs[key].items()
                                  if f"{name}.{split}" not in explicit}, **(ours[key] or {}))
            if name not in explicit:
                if key in theirs:
                    ours[key] = theirs[key]
            elif (is_fixed(section, key) or _fp16_switch(name, ours.get(key), theirs.get(key))) \
                    and (key not in theirs or ours.get(key) != theirs[key]) \
                    and not (name == "data.vocab" and _kept_vocabulary(ours[key], model_dir)) \
                    and not (name == "data.files" and _moved_corpus(  # data_dir: resolved
                        ours[key], theirs.get(key),                   # above, in key order
                        ours.get("data_dir") or os.path.join(model_dir, "data"))):
                before = repr(theirs[key]) if key in theirs else "not recorded"
                conflicts.append(f"{key}={ours.get(key)!r} (saved: {before})")
    conflicts += _replanned_budget(resolved["train"], saved.get("train") or {}, explicit,
                                   model_dir)
    if "init_from" in saved:  # where the run started (train.py --init_from) stays recorded
        resolved.setdefault("init_from", saved["init_from"])
    if conflicts:
        raise SettingsError(f"{model_dir} holds a run with other settings: "
                            f"{', '.join(conflicts)}. Use a new --model_dir, or drop these flags "
                            "to continue the saved run."
                            + _test_set_hint(model_dir, resolved["data"], saved.get("data")))
    return resolved


def _test_set_hint(model_dir, ours, theirs):
    """How to score the run on a test set, where its test files are the only change asked for."""
    ours, theirs = ours.get("files") or {}, (theirs or {}).get("files") or {}
    test = ours.get("test")
    if not test or test == theirs.get("test") or \
            {k: v for k, v in ours.items() if k != "test"} != \
            {k: v for k, v in theirs.items() if k != "test"}:
        return ""
    sides = test.split(",") if isinstance(test, str) and "," in test else None
    model_dir = shlex.quote(model_dir)  # a command to copy
    if sides and len(sides) == 2:
        return (" To score the trained model on a test set: python evaluate.py "
                f"--model_dir={model_dir} --source={shlex.quote(sides[0])} "
                f"--reference={shlex.quote(sides[1])}")
    return (" To score the trained model on a test set: python evaluate.py "
            f"--model_dir={model_dir} with its sources as --source and references as --reference")


def write_json(path, value):
    """Writes JSON atomically (the old file or the new one, never half of one).

    Args:
      path: the file.
      value: a JSON-able value.
    """
    write_atomically(path, json.dumps(value, indent=1, sort_keys=True))
