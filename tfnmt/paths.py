"""Names of the files in a model_dir, and where the embedded corpus lives, in one place (every
entry point and module reads them from here); reading a model_dir's settings.json and listing
its checkpoints, finding an export's newest version, whether a directory can be written in,
making one that a failed write removes again, writing a file atomically, whether an error means
a full disk (without TensorFlow, so that the entry points check their flags and paths before
loading it)."""
import contextlib
import errno
import json
import os
import re
import tempfile

# The embedded German-English corpus, shipped inside the package: {train,dev,test}.tsv.gz.
EMBEDDED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "de-en")
# Where train.py, export.py, translate.py and evaluate.py look when --model_dir is not given.
DEFAULT_MODEL_DIR = os.path.join("runs", "de-en")
SETTINGS = "settings.json"    # every setting of the run
VOCAB = "spm.model"           # the SentencePiece model (also in each prepared data dir)
CHECKPOINTS = "checkpoints"   # ckpt-<step>, written by tf.train.CheckpointManager
AVERAGED = "averaged"         # the average of the last N checkpoints
BEST = "best"                 # the checkpoint with the best dev metric (--best_metric)
BEST_STATE = "best.json"      # in BEST: the metric, its best value and step
EXPORT = "export"             # export.py's default export_dir: numbered SavedModel versions
CTRANSLATE2 = "ctranslate2"  # export.py --format=ctranslate2 (+ "-<quantization>")
CTRANSLATE2_SETTINGS = "tfnmt.json"  # beside a CTranslate2 model: its max_length
REPORT = "report.json"        # the final evaluation of the main job's end-of-run report
TEST_TRANSLATIONS = "test.hyp"  # that report's translations of the test split, one per line
DECODING = "decoding.json"    # the length penalty chosen on dev at the end of training


def cannot_write_in(directory):
    """Why no file can be created in `directory` (e.g. "Read-only file system"), or None where
    one can: found by creating one, since `os.access` answers yes to root on a read-only mount
    or in /proc. A missing directory is judged by its nearest existing parent (where it would be
    created)."""
    directory = os.path.abspath(directory)
    while not os.path.isdir(directory) and os.path.dirname(directory) != directory:
        directory = os.path.dirname(directory)
    try:
        descriptor, probe = tempfile.mkstemp(dir=directory, prefix=".write-test-")
    except OSError as error:
        return error.strerror or str(error)
    os.close(descriptor)
    os.remove(probe)
    return None


def is_disk_full(error):
    """Whether an error means the disk is full.

    Args:
      error: an OSError or a TensorFlow error (tf.errors.OpError).

    Returns:
      True for ENOSPC/EDQUOT and TensorFlow's "No space left on device".
    """
    if isinstance(error, OSError):
        return error.errno in (errno.ENOSPC, errno.EDQUOT)
    return "No space left on device" in str(error)


def write_atomically(path, data):
    """Writes `data` (str, as UTF-8, or bytes) to `path` through a temporary file beside it,
    flushed to the disk and renamed over it: a reader, or a crash, sees the old file or the new
    one, never half of one. A write that fails (a full disk) leaves no temporary file, and its
    OSError names `path` (an error of a write names no file).

    Args:
      path: the file.
      data: its new contents.
    """
    temporary = f"{path}.tmp-{os.getpid()}"
    try:
        with open(temporary, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        if isinstance(error, OSError):
            raise OSError(error.errno, error.strerror, path) from None
        raise


@contextlib.contextmanager
def made_directory(directory):
    """Creates `directory` and its missing parents for the work of a `with` block, and removes
    those it created again if the block fails and leaves them empty (a failed export leaves no
    empty export_dir behind).

    Example:
      with made_directory(export_dir):
          write_version(export_dir)  # raises: export_dir is gone again if this made it
    """
    directory = os.path.abspath(directory)
    missing = []  # deepest first
    while not os.path.exists(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    if missing:
        os.makedirs(missing[0], exist_ok=True)  # another process may make it meanwhile
    try:
        yield
    except BaseException:
        for path in missing:
            try:
                os.rmdir(path)  # only when empty: another process may have written in it
            except OSError:
                break
        raise


def checkpoint_prefixes(directory, name="ckpt"):
    """The checkpoints in a directory, found from the files themselves (the `checkpoint` state
    file is only an index of them).

    Args:
      directory: a checkpoint directory (need not exist).
      name: the checkpoints' prefix.

    Returns:
      The `<directory>/<name>-N` prefixes whose index file exists, oldest first.
    """
    if not os.path.isdir(directory):
        return []
    pattern = re.compile(re.escape(name) + r"-(\d+)\.index$")
    numbers = sorted(int(m.group(1)) for m in map(pattern.match, os.listdir(directory)) if m)
    return [os.path.join(directory, f"{name}-{n}") for n in numbers]


def is_export(path):
    """Whether `path` is a SavedModel export: a version directory (saved_model.pb), or an
    export_dir of numbered versions, such as export.py writes."""
    names = os.listdir(path) if os.path.isdir(path) else []
    candidates = [path] + [os.path.join(path, name) for name in names if name.isdigit()]
    return any(os.path.exists(os.path.join(c, "saved_model.pb")) for c in candidates)


def next_version(export_dir):
    """The version number a new export gets.

    Args:
      export_dir: the directory of numbered versions (need not exist).

    Returns:
      One more than the largest version there, or 1.
    """
    versions = [int(n) for n in os.listdir(export_dir) if re.fullmatch(r"\d+", n)] \
        if os.path.isdir(export_dir) else []
    return max(versions, default=0) + 1


def latest_export(path):
    """The SavedModel a path names.

    Args:
      path: an export version directory, or an export_dir of numbered versions.

    Returns:
      The version directory (the newest one under an export_dir).

    Raises:
      FileNotFoundError: `path` holds neither (the message names what it is instead).
    """
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return path
    version = next_version(path) - 1
    if version < 1:
        hint = other_kind(path)
        raise FileNotFoundError(f"{path} holds no SavedModel and no numbered version of one"
                                + (f"; {hint}" if hint else ""))
    return os.path.join(path, str(version))


def is_ctranslate2(path):
    """Whether `path` is a CTranslate2 model directory (export.py --format=ctranslate2)."""
    return all(os.path.exists(os.path.join(path, name)) for name in ("model.bin", "config.json"))


def other_kind(path):
    """What a directory given in the wrong place is, for the error: "it is ...", or "" when it
    is none of tfnmt's kinds."""
    if is_export(path):
        return "it is a SavedModel export: translate.py and evaluate.py read it with --export"
    if is_ctranslate2(path):
        return "it is a CTranslate2 model: translate.py and evaluate.py read it with --export"
    if os.path.exists(os.path.join(path, SETTINGS)):
        return "it is a training directory: give it as --model_dir"
    return ""


def no_model_error(model_dir):
    """The one-line error for a model_dir without settings.json, naming what the directory is
    instead where it is another of tfnmt's kinds."""
    hint = other_kind(model_dir)
    return f"{model_dir} holds no trained model (no {SETTINGS})" + (f"; {hint}" if hint else "")


class DamagedFileError(ValueError):
    """A model_dir file that is there but does not read as what tfnmt writes there (cut short,
    overwritten, or edited by hand into something else). The programs print it as one line."""


def read_settings(model_dir):
    """A model_dir's settings.json.

    Returns:
      The settings dict, or None where the file is missing.

    Raises:
      DamagedFileError: the file is not a JSON object.
    """
    path = os.path.join(model_dir, SETTINGS)
    try:
        with open(path, encoding="utf-8") as f:
            settings = json.load(f)
    except FileNotFoundError:
        return None
    except ValueError as error:  # json.JSONDecodeError, UnicodeDecodeError
        raise DamagedFileError(f"{path} does not read as JSON ({error}): restore it as train.py "
                               "wrote it, or use another --model_dir") from None
    if not isinstance(settings, dict):
        raise DamagedFileError(f"{path} holds a JSON {type(settings).__name__}, not the object "
                               "of settings train.py writes: restore it, or use another "
                               "--model_dir")
    for section in ("model", "data", "train"):
        if not isinstance(settings.get(section, {}), dict):
            raise DamagedFileError(f"{path}: its {section!r} is a JSON "
                                   f"{type(settings[section]).__name__}, not the object of "
                                   "settings train.py writes: restore it, or use another "
                                   "--model_dir")
    return settings
