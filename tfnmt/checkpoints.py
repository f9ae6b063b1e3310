"""Loading a trained model from a model_dir: its settings, vocabulary and the newest checkpoint
that reads back; finding, indexing and cleaning up a model_dir's checkpoint files; a lock that
keeps a checkpoint directory to one writer."""
import contextlib
import fcntl
import json
import logging
import os
import re
import shutil

import tensorflow as tf

from tfnmt.data import vocabulary
from tfnmt.model.transformer import Transformer
from tfnmt.paths import (AVERAGED, BEST, BEST_STATE, CHECKPOINTS, SETTINGS, DamagedFileError,
                         checkpoint_prefixes, no_model_error, read_settings)


class ModelDirError(ValueError):
    """A model_dir that cannot be used as asked (one line, naming the file)."""


def _number(prefix):
    """N of a `<directory>/ckpt-N` prefix."""
    return int(prefix.rsplit("-", 1)[1])


def newest_readable_checkpoint(directory, name="ckpt"):
    """The newest checkpoint that reads back.

    Args:
      directory: a checkpoint directory.
      name: the checkpoints' prefix.

    Returns:
      The newest `<name>-N` prefix whose index and data files read, or None.
    """
    for prefix in reversed(checkpoint_prefixes(directory, name)):
        try:
            reader = tf.train.load_checkpoint(prefix)
            for key in reader.get_variable_to_shape_map():
                reader.get_tensor(key)
            return prefix
        except (tf.errors.OpError, ValueError, IndexError):
            continue
    return None


def remove_interrupted_saves(directory, name="ckpt"):
    """Removes `<name>-N_temp/` folders: TensorFlow writes a checkpoint's shards there and
    moves them into place when complete, so one is left only by a save that was interrupted.
    Call only as the directory's one writer (DirectoryLock).

    Args:
      directory: a checkpoint directory.
      name: the checkpoints' prefix.

    Returns:
      The folders removed.
    """
    if not os.path.isdir(directory):
        return []
    pattern = re.compile(re.escape(name) + r"-\d+_temp$")
    removed = [os.path.join(directory, entry) for entry in sorted(os.listdir(directory))
               if pattern.match(entry) and os.path.isdir(os.path.join(directory, entry))]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


class DirectoryLock:
    """An exclusive lock on `directory` (a `.lock` file in it, flock'ed) for the time of a
    `with` block: a second process that tries to write the same checkpoints gets ModelDirError
    at once, naming the process that holds it. The operating system releases it when the
    holder exits, however it exits. On a file system without locks (NFS without its lock
    service, Lustre mounted without flock, some FUSE file systems) the directory is used
    unlocked, with a warning.

    Args:
      directory: the directory to lock (created if missing).

    Example:
      with DirectoryLock(checkpoint_dir):
          ...  # the only writer of checkpoint_dir
    """

    def __init__(self, directory):
        self.path = os.path.join(directory, ".lock")
        self.directory = directory
        self._file = None

    def __enter__(self):
        os.makedirs(self.directory, exist_ok=True)
        self._file = open(self.path, "a+")
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "another process"
            self._file.close()
            raise ModelDirError(f"{self.directory} is in use by {holder} (one training run "
                                "per model_dir)") from None
        except OSError as error:  # ENOLCK, ENOSYS, EOPNOTSUPP: no locks on this file system
            logging.warning("%s: cannot lock it (%s): a second training run in this model_dir "
                            "would not be refused", self.directory, error.strerror)
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"pid {os.getpid()}\n")
        self._file.flush()
        return self

    def __exit__(self, *exc_info):
        self._file.close()  # releases the lock


def repair_checkpoint_state(directory, name="ckpt"):
    """Rewrites `directory`'s `checkpoint` state file from the checkpoint files when it is
    missing, unreadable or names other checkpoints than those on disk (so that a damaged state
    file never makes a run start over).

    Args:
      directory: a checkpoint directory.
      name: the checkpoints' prefix.

    Returns:
      A one-line description of the repair, or None when the state file was right.
    """
    prefixes = checkpoint_prefixes(directory, name)
    if not prefixes:
        return None
    try:
        state = tf.train.get_checkpoint_state(directory)
        problem = None if state else "missing or unreadable"
    except (ValueError, UnicodeDecodeError, tf.errors.OpError) as error:
        state, problem = None, f"unreadable ({type(error).__name__})"
    if state:
        listed = [os.path.basename(p) for p in state.all_model_checkpoint_paths]
        on_disk = [os.path.basename(p) for p in prefixes]
        if listed != on_disk or os.path.basename(state.model_checkpoint_path) != on_disk[-1]:
            problem = f"out of date (it lists {listed or 'nothing'}, the files are {on_disk})"
    if problem is None:
        return None
    # Timestamps after last_preserved_timestamp: CheckpointManager keeps rotating these (it
    # would count checkpoints without one as preserved forever and list none of them).
    times = [os.path.getmtime(p + ".index") for p in prefixes]
    tf.compat.v1.train.update_checkpoint_state(  # written atomically
        directory, prefixes[-1], prefixes, all_model_checkpoint_timestamps=times,
        last_preserved_timestamp=min(times) - 1.0)
    return (f"{os.path.join(directory, 'checkpoint')} was {problem}; rebuilt from the "
            f"{len(prefixes)} checkpoint file(s) there (newest {os.path.basename(prefixes[-1])})")


def read_best_state(directory):
    """The best checkpoint's state in a directory.

    Args:
      directory: <model_dir>/best.

    Returns:
      The state dict, or None when there is none (or it does not parse).
    """
    try:
        with open(os.path.join(directory, BEST_STATE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def best_checkpoint(directory):
    """The best checkpoint's prefix.

    Args:
      directory: <model_dir>/best.

    Returns:
      The prefix the state names if its files exist, else the newest checkpoint there, or None.
    """
    state = read_best_state(directory) or {}
    if state.get("checkpoint"):
        prefix = os.path.join(directory, state["checkpoint"])
        if tf.io.gfile.exists(prefix + ".index"):
            return prefix
    prefixes = checkpoint_prefixes(directory)
    return prefixes[-1] if prefixes else None


def candidate_checkpoints(model_dir, which="auto"):
    """The checkpoints to try loading, best first, found from the files (a damaged state file
    does not hide them).

    Args:
      model_dir: a training directory.
      which: "latest" (the run's checkpoints, newest first), "averaged", "best" (the one
        with the best dev metric), "auto" (averaged ones made at the run's newest update, then
        the best, then the latest ones) or a checkpoint path prefix; a relative prefix that is
        not a path from here is looked for in the model_dir (`best/ckpt-2000`, as the errors
        list them) and its checkpoints/, best/ and averaged/ (`ckpt-2000`); a directory of
        checkpoints (`runs/de-en/best`) gives them, newest first. An average made before the
        run was resumed and trained on without averaging is older than the model: "auto"
        passes over it.

    Returns:
      Checkpoint prefixes, best first.

    Raises:
      ModelDirError: none found.
    """
    if which not in ("auto", "latest", "averaged", "best"):
        places = [which] if os.path.isabs(which) else [which, os.path.join(model_dir, which)] + [
            os.path.join(model_dir, sub, which) for sub in (CHECKPOINTS, BEST, AVERAGED)]
        for prefix in places:
            if tf.io.gfile.exists(prefix + ".index"):
                return [prefix]
            if found := checkpoint_prefixes(prefix):  # a directory of checkpoints: newest first
                return found[::-1]
        names = _held_checkpoints(model_dir)
        raise ModelDirError(f"no checkpoint at {which}" + (
            f"; {model_dir} holds {', '.join(names)}" if names else ""))
    averaged = checkpoint_prefixes(os.path.join(model_dir, AVERAGED))[::-1]
    best = [p for p in [best_checkpoint(os.path.join(model_dir, BEST))] if p]
    latest = checkpoint_prefixes(os.path.join(model_dir, CHECKPOINTS))[::-1]
    current = [p for p in averaged if not latest or _number(p) >= _number(latest[0])]
    paths = {"averaged": averaged, "best": best, "latest": latest,
             "auto": current + best + latest}[which]
    if not paths:
        if names := _held_checkpoints(model_dir):
            raise ModelDirError(f"{model_dir} has no {which} checkpoint; it holds "
                                f"{', '.join(names)}")
        raise ModelDirError(f"{model_dir} has no checkpoint yet (train.py writes them as it "
                            "trains, every --checkpoint_every updates)")
    return paths


def _held_checkpoints(model_dir):
    """The model_dir's checkpoints, as paths relative to it: the run's, the best, the
    averaged."""
    return [os.path.relpath(p, model_dir) for sub in (CHECKPOINTS, BEST, AVERAGED)
            for p in checkpoint_prefixes(os.path.join(model_dir, sub))]


def _check_same_model(path, model_dir, model, protos):
    """Refuses a checkpoint of another training directory whose settings.json shows another
    vocabulary or architecture: same-shaped weights would load and translate with the wrong
    subwords, or through other layers, without a word.

    Raises:
      ModelDirError: it is another model's.
    """
    parent = os.path.dirname(os.path.abspath(path))
    owner = os.path.dirname(parent)
    if os.path.basename(parent) not in (CHECKPOINTS, BEST, AVERAGED) or \
            os.path.samefile(owner, model_dir):
        return
    try:
        theirs = read_settings(owner)
        their_config = Transformer(**theirs["model"]).get_config()
        their_protos = vocabulary.read_protos(*vocabulary.paths(
            owner, theirs.get("data", {}).get("separate_vocabularies", False)))
    except (DamagedFileError, OSError, KeyError, TypeError, ValueError):
        return  # not a training directory: nothing to compare with
    if their_protos.fingerprint != protos.fingerprint:  # what tokenizes, not where it was made
        difference = f"vocabulary is not {model_dir}'s"
    else:
        our_config = model.get_config()
        ignored = {"name", "trainable", "dtype"}
        if our_config["position"] == their_config["position"] == "sinusoidal":
            ignored.add("max_length")  # a cap on input length, not weights
        keys = sorted(k for k in set(our_config) | set(their_config)
                      if k not in ignored and "dropout" not in k and
                      our_config.get(k) != their_config.get(k))
        if not keys:
            return
        difference = f"model is not {model_dir}'s (" + ", ".join(
            f"{k} {their_config.get(k)} there, {our_config.get(k)} here" for k in keys) + ")"
    raise ModelDirError(f"{path} is a checkpoint of {owner}, whose {difference}: give "
                        f"--model_dir={owner} to use it")


_SHAPE_MISMATCH = re.compile(r"Received incompatible tensor with shape (\(.*?\)) when attempting "
                             r"to restore variable with shape (\(.*?\)) and name (\S+?)(:0)?\.?$")


def _read_weights(model, path, model_dir):
    """Restores `model`'s weights from the checkpoint `path`; returns None, or why they did not
    read back in a few words (TensorFlow's first line, or for another model's weights the
    variable and both shapes, or the variables it lacks)."""
    try:
        tf.train.Checkpoint(model=model).read(path).expect_partial() \
            .assert_existing_objects_matched()
        return None
    except (tf.errors.OpError, ValueError, AssertionError, IndexError, KeyError) as error:
        message = str(error).strip()
    line = message.splitlines()[0] if message else "unreadable"
    mismatch = _SHAPE_MISMATCH.search(line)
    if mismatch:
        held, wanted, name = mismatch.group(1, 2, 3)
        name = name.split("/", 1)[-1]  # without the model's own name (transformer_N/)
        return (f"another model's weights: {name} is {held} there, {wanted} in the model "
                f"{os.path.join(model_dir, SETTINGS)} describes")
    unbound = re.findall(r"<Variable path=[^/\s]+/([^,\s]+),", message)
    if unbound:  # variables of this model that the checkpoint does not hold
        return (f"another model's weights: none for {', '.join(unbound[:3])}"
                f"{' …' if len(unbound) > 3 else ''}, which the model "
                f"{os.path.join(model_dir, SETTINGS)} describes has")
    return line[:300]


@contextlib.contextmanager
def _failed_read_warnings_silenced():
    """A read that fails part-way leaves TensorFlow's restore state with unread values, and
    freeing it logs a warning per value (over a hundred lines for a small model) above the one
    line that says what is wrong: the read and the end of its exception (which holds that
    state) go in this block, with TensorFlow's warnings off."""
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def load_model(model_dir, which="auto"):
    """Loads a trained model from a model_dir.

    Args:
      model_dir: a directory `train.py` wrote.
      which: "auto" (the averaged checkpoint of the newest update if any, else the best,
        else the newest),
        "latest", "averaged", "best", or a checkpoint path prefix. The first candidate
        that reads back is used.

    Returns:
      (a float32 `Transformer` with the restored weights, its `vocabulary.VocabularyProtos`
      (the SentencePiece models), the checkpoint path). bfloat16 inference is chosen where the
      model is used (`serving.TranslationModule`'s matmul_dtype).

    Raises:
      ModelDirError: no settings, vocabulary or readable checkpoint.
      DamagedFileError: settings.json that does not describe a model, or a vocabulary file
        that is not the one settings.json records.
    """
    settings = read_settings(model_dir)
    if settings is None:
        raise ModelDirError(no_model_error(model_dir))
    try:
        protos = vocabulary.read_protos(*vocabulary.paths(
            model_dir, (settings.get("data") or {}).get("separate_vocabularies", False)))
    except OSError as error:
        raise ModelDirError(f"{model_dir} has no vocabulary ({error})") from None
    # A vocabulary file replaced since (the same size of another model's) would load and
    # tokenize wrongly.
    trained_with = settings.get("vocab_fingerprint")
    if trained_with and protos.fingerprint != trained_with:
        names = sorted(set(vocabulary.file_names(
            (settings.get("data") or {}).get("separate_vocabularies", False)).values()))
        raise DamagedFileError(f"{' and '.join(os.path.join(model_dir, n) for n in names)}: "
                               "not the vocabulary the model was trained with (its fingerprint "
                               f"is not the one {SETTINGS} records): restore it from the run's "
                               "prepared data (its data_dir), or use another --model_dir")
    try:
        model = Transformer(**settings["model"], dtype="float32")
    except (KeyError, TypeError, ValueError) as error:  # edited by hand, or cut short
        what = "holds no model settings" if isinstance(error, KeyError) else \
            f"holds model settings that build no model ({error})"
        raise DamagedFileError(f"{os.path.join(model_dir, SETTINGS)} {what}: restore it as "
                               "train.py wrote it, or use another --model_dir") from None
    model.build()
    failures = []
    for path in candidate_checkpoints(model_dir, which):
        _check_same_model(path, model_dir, model, protos)
        with _failed_read_warnings_silenced():
            failure = _read_weights(model, path, model_dir)
        if failure:
            failures.append(f"{os.path.basename(path)}: {failure}")
            continue
        if failures:
            logging.warning("using %s: newer checkpoints do not read back (%s)", path,
                            "; ".join(failures))
        return model, protos, path
    raise ModelDirError(f"no checkpoint of {model_dir} reads back ({'; '.join(failures)})")

