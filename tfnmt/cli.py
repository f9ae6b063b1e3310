"""What the entry points (train.py, export.py, translate.py, evaluate.py) share."""
import _thread
import gc
import math
import os
import re
import signal
import sys
import threading
import urllib.parse

from absl import app, flags

from tfnmt import address_space, allocator, cpu_kernels, cpu_quota, paths, tensorflow_start
from tfnmt.paths import DamagedFileError
from tfnmt.text_lines import OutputError

# What use_fast_allocator(), use_onednn() and limit_threads() chose for this process (set by
# run()); THREADS None: TensorFlow's default, a thread per core.
ALLOCATOR = "system"
KERNELS = "TensorFlow's default"
THREADS = None


def define_beam_stop_flag(scope=""):
    """--beam_stop, as export.py, translate.py and evaluate.py take it (`scope`: to whom it
    applies, e.g. "With --model_dir: ")."""
    text = (f"{scope}when a sentence's beam search ends: finished (default: once beam_size "
            "hypotheses have ended, as in CTranslate2) or bound (once none left can beat "
            "them; slower).")
    flags.DEFINE_enum("beam_stop", "finished", ["finished", "bound"], text[0].upper() + text[1:])


def define_no_repeat_flag(scope="", training=False):
    """--no_repeat_ngram_size, as export.py, translate.py and evaluate.py take it (`scope`: to
    whom it applies), or as train.py takes it (`training`: the rule of the run's end, kept in
    its model_dir); default None: the model's own (`length_penalty.default_no_repeat`)."""
    if training:
        text = ("N > 0: the run's beam searches (the length penalty's choice, the test "
                "report, dev evaluations with --eval_beam_size > 1) repeat no sequence of N "
                "subwords, and decoding.json keeps N as the default of export.py, translate.py "
                "and evaluate.py; default: the model_dir's, else 0 (allowed).")
    else:
        text = (f"{scope}N > 0: no translation repeats a sequence of N subwords (a beam search "
                "rule, as CTranslate2's); default: the model's own (train.py's, kept in "
                "decoding.json or a CTranslate2 model's tfnmt.json), else 0.")
    flags.DEFINE_integer("no_repeat_ngram_size", None, text[0].upper() + text[1:])
    flags.register_validator("no_repeat_ngram_size", lambda v: v is None or v >= 0,
                             "--no_repeat_ngram_size must be >= 0")


def register_alpha_validator():
    """--alpha (a float flag, None for the model_dir's own) must be finite and >= 0: an infinite
    length penalty scores every hypothesis 0 (export.py, translate.py, evaluate.py)."""
    flags.register_validator("alpha", lambda v: v is None or 0.0 <= v < math.inf,
                             "--alpha must be >= 0 and finite")


def check_model_path(model_dir, export):
    """Raises app.UsageError (one line, before TensorFlow loads) for a --model_dir without
    settings.json, or an --export that holds no SavedModel and is no CTranslate2 model of
    export.py (translate.py, evaluate.py)."""
    try:
        if export and paths.is_ctranslate2(export):
            from tfnmt.inference.ctranslate2_translator import CTranslate2ModelError, check_runnable

            try:
                check_runnable(export)
            except CTranslate2ModelError as error:
                raise app.UsageError(str(error))
        elif export:
            paths.latest_export(export)
        elif paths.read_settings(model_dir) is None:
            raise app.UsageError(paths.no_model_error(model_dir))
    except FileNotFoundError as error:
        raise app.UsageError(str(error))


def refuse_checkpoint_search_flags(export):
    """Raises app.UsageError for a checkpoint search's flag given with --export (translate.py,
    evaluate.py), which would otherwise be ignored: a SavedModel searches as export.py built
    it; a CTranslate2 model searches with CTranslate2's beam search, which takes --beam_size,
    --alpha (its length_penalty) and --no_repeat_ngram_size."""
    if paths.is_ctranslate2(export):
        for name in ("beam_stop", "checkpoint"):
            if flags.FLAGS[name].present:
                raise app.UsageError(f"--{name} applies to --model_dir; {export} is a "
                                     "CTranslate2 model, which searches its own way")
        return
    for name in ("beam_size", "alpha", "beam_stop", "no_repeat_ngram_size", "checkpoint"):
        if flags.FLAGS[name].present:
            raise app.UsageError(f"--{name} applies to --model_dir; an export searches as "
                                 f"export.py built it (export.py --{name})")


def check_output_path(path, inputs=None):
    """Raises app.UsageError (one line, before any work) for an --output path that cannot be
    written: a directory, or in a directory that is missing or not writable; or one of the
    files the program reads (`inputs`: {flag name: path or None}, or (flag name, path) pairs),
    which writing would lose."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise app.UsageError(f"--output {path}: is a directory, not a file")
    if not os.path.isdir(directory):
        raise app.UsageError(f"--output {path}: directory {directory} does not exist")
    if reason := paths.cannot_write_in(directory):
        raise app.UsageError(f"--output {path}: directory {directory} is not writable ({reason})")
    pairs = inputs.items() if isinstance(inputs, dict) else (inputs or ())
    for flag, input_path in pairs:
        if input_path not in (None, "-") and os.path.exists(path) and \
                os.path.exists(input_path) and os.path.samefile(path, input_path):
            raise app.UsageError(f"--output {path}: is the --{flag} file, which writing the "
                                 "output would overwrite")


def _list_program_flags_in_help():
    """absl's --help lists the flags of the module run as the program (sys.argv[0]): here a
    shim or a console script, while tfnmt's flags are defined in tfnmt/programs/<name>.py and
    tfnmt/cli.py. They become the program's key flags, so that --help lists each of them with
    its default (absl's own flags stay in --helpfull)."""
    for module, defined in flags.FLAGS.flags_by_module_dict().items():
        if module.split(".")[0] == "tfnmt":
            for flag in defined:
                flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)


# Flags that name files or directories (or "source,target" pairs of files). The shell turns a
# leading ~ into the home directory, but not after "--flag=", where it would stay "~" and make
# a directory of that name in the working directory: done here.
PATH_FLAGS = ("model_dir", "data_dir", "tfds_data_dir", "init_from", "vocab", "train_files",
              "dev_files", "test_files", "export", "export_dir", "checkpoint", "input", "output",
              "score_targets", "target_prefix", "plot_attention", "source", "reference",
              "hypotheses")


def each_path(value, change):
    """`value` of a path flag (a path, "a,b" paths, or a list of them) with `change` applied
    to each path in it."""
    if isinstance(value, str):
        return ",".join(change(part) for part in value.split(","))
    if isinstance(value, list):
        return [each_path(item, change) for item in value]
    return value


def expand_home(value):
    """`value` (as `each_path` takes it) with each leading ~ or ~user made the home directory
    (os.path.expanduser)."""
    return each_path(value, os.path.expanduser)


# A URL's scheme (gs://, s3://, hdfs://, https://, file://).
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def local_paths(name, value):
    """`value` of the path flag `name` (as `each_path` takes it) with file:// URLs made the
    paths they name.

    Raises:
      ValueError: another URL (gs://, s3://, ...). tfnmt reads and writes files with Python's
        own file functions, which would take "gs://bucket/run" for a local directory "gs:"
        and write the run there, lost with the machine. (TFDS reads its own --tfds_data_dir,
        which may be a bucket.)
    """
    def local(path):
        match = _URL.match(path)
        if match and match.group(1).lower() == "file" and path[len("file://"):].startswith("/"):
            return urllib.parse.unquote(path[len("file://"):])  # file:///a%20b: "/a b"
        if match:
            raise ValueError(
                f"--{name}={path} is a URL; tfnmt reads and writes paths on this machine's file "
                "systems: copy the files here, or mount the bucket (gcsfuse, mountpoint-s3, "
                "s3fs) and give its local path")
        return path

    return each_path(value, local)


def _parse_flags(argv):
    try:
        argv = flags.FLAGS(argv)
        for name in PATH_FLAGS:
            if name in flags.FLAGS and flags.FLAGS[name].value is not None \
                    and name != "tfds_data_dir":
                flags.FLAGS[name].value = local_paths(name, flags.FLAGS[name].value)
    except (flags.Error, ValueError) as error:
        print(f"{os.path.basename(sys.argv[0])}: {error}", file=sys.stderr)
        sys.exit(1)
    for name in PATH_FLAGS:
        if name in flags.FLAGS and flags.FLAGS[name].value is not None:
            flags.FLAGS[name].value = expand_home(flags.FLAGS[name].value)
    return argv


class ExitAtOnce(Exception):
    """Raised from a program's main: `run` prints its message as the program's one line and the
    process exits with `code` right after, without tearing the interpreter down. For a process
    of a training cluster that stops while another is gone or stopping, whose TensorFlow threads
    (the coordination service's heartbeat) would otherwise log the lost task after that line as
    the interpreter tears down. The standard streams are flushed first; the program must have
    closed its own files (no finalizer runs)."""

    def __init__(self, message, code=1):
        super().__init__(message)
        self.code = code


class Terminated(KeyboardInterrupt):
    """SIGTERM (what `kill`, Kubernetes and Slurm send before they kill a job), raised where
    Ctrl-C raises KeyboardInterrupt: a program cleans up and says what it leaves as for Ctrl-C,
    then exits 143 (128 + SIGTERM) instead of dying at once. Training's own handler
    (`stop_signals.StopSignals`) takes both signals (and SIGHUP) over while it trains; on a
    cluster worker TensorFlow's runtime takes SIGTERM itself (a notice of preemption) once its
    strategy starts."""


def stop_on_sigterm():
    """Makes SIGTERM raise `Terminated` in the main thread (unless the process ignores it)."""
    def terminate(signum, frame):
        raise Terminated()

    if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
        signal.signal(signal.SIGTERM, terminate)


def keep_interrupts():
    """Makes a Ctrl-C that lands in a finalizer stop the program.

    Python runs the SIGINT handler wherever the main thread is, and when that is an object's
    `__del__` (TensorFlow runs many), the KeyboardInterrupt is printed as "Exception ignored
    in ..." and lost: the program went on, a training run to its end. Such a KeyboardInterrupt
    is raised again in the main thread once the finalizer is left: a timer thread calls
    `_thread.interrupt_main` 50 ms later (called at once, it would raise in this hook, which
    loses it too).
    """
    previous = sys.unraisablehook

    def interrupt_later(kind):
        signum = signal.SIGTERM if issubclass(kind, Terminated) else signal.SIGINT
        timer = threading.Timer(0.05, _thread.interrupt_main, args=(signum,))
        timer.daemon = True
        timer.start()

    def hook(unraisable):
        try:
            if unraisable.exc_type is not None and issubclass(unraisable.exc_type,
                                                              KeyboardInterrupt):
                interrupt_later(unraisable.exc_type)
            else:
                previous(unraisable)
        except KeyboardInterrupt as interrupt:  # the one raised again, or another, got here
            interrupt_later(type(interrupt))

    sys.unraisablehook = hook


def leave_out_optional_imports():
    """Keras imports IPython and matplotlib where they are installed, each guarded as optional
    (a notebook check, an image gallery); a program run from the command line uses neither,
    and they cost ~0.75 s of its start (3.6 against 2.8 s to a first op on a Zen 4 EPYC)."""
    for optional in ("IPython", "matplotlib"):
        sys.modules.setdefault(optional, None)


def before_tensorflow(training):
    """What a program sets up before TensorFlow is imported, after its allocator: for training
    oneDNN's kernels (tfnmt/cpu_kernels.py), threads for the cores a CPU limit gives
    (tfnmt/cpu_quota.py), and the filter for TensorFlow's start (tfnmt/tensorflow_start.py).

    Returns:
      (kernels, threads): what the process runs, for its log (KERNELS, THREADS).
    """
    kernels = cpu_kernels.use_onednn() if training else cpu_kernels.describe()
    threads = cpu_quota.limit_threads()
    tensorflow_start.install()
    return kernels, threads


def run(main, doc=None, training=False):
    """absl's app.run(main), with flag errors, an app.UsageError, a damaged model_dir file
    (`paths.DamagedFileError`) and an output file that could not be written
    (`text_lines.OutputError`) printed as one line, `<program>: <message>`, and exit code 1
    (absl would print the module's help before a UsageError, and a hint after a flag error);
    an `ExitAtOnce` the same way, the process exiting right after its line;
    Ctrl-C outside what a program handles itself prints `<program>: interrupted` (exit 130),
    also where it lands in a finalizer (`keep_interrupts`); SIGTERM the same, as
    `<program>: stopped by SIGTERM` (exit 143; `Terminated`).
    First the process gets its memory allocator (tfnmt/allocator.py; may re-execute the process
    once), for training its CPU kernels (tfnmt/cpu_kernels.py), threads for the cores a CPU
    limit gives (tfnmt/cpu_quota.py), and a filter for what TensorFlow's libraries print when
    it is imported (tfnmt/tensorflow_start.py).

    Args:
      main: the entry point's main(argv).
      doc: the program's description, which --help prints (absl reads it from __main__,
        which is a shim or a console script, not the module that defines the program).
      training: the program trains (oneDNN's kernels where they train faster); programs that
        only decode keep TensorFlow's default kernels.
    """
    global ALLOCATOR, KERNELS, THREADS
    if doc:
        sys.modules["__main__"].__doc__ = doc
    _list_program_flags_in_help()
    leave_out_optional_imports()
    try:
        ALLOCATOR = allocator.use_fast_allocator()
    except allocator.AllocatorError as error:
        print(f"{os.path.basename(sys.argv[0])}: {error}", file=sys.stderr)
        sys.exit(1)
    # What the programs print (paths, a sentence) in an encoding the locale's cannot hold (a
    # Latin-1 terminal) shows as \u escapes, as Python's stderr does, instead of failing
    # after the work; translations are written in UTF-8 (text_lines.LineWriter).
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    if notice := address_space.warning():
        print(f"{os.path.basename(sys.argv[0])}: {notice}", file=sys.stderr, flush=True)
    KERNELS, THREADS = before_tensorflow(training)
    keep_interrupts()
    stop_on_sigterm()

    def main_with_one_line_usage_errors(argv):
        try:
            return main(argv)
        except ExitAtOnce as stop:
            print(f"{os.path.basename(sys.argv[0])}: {stop}", file=sys.stderr)
            for stream in (sys.stdout, sys.stderr):
                if stream is not None:
                    stream.flush()
            os._exit(stop.code)
        except (app.UsageError, DamagedFileError, OutputError) as error:
            print(f"{os.path.basename(sys.argv[0])}: {error}", file=sys.stderr)
            return 1
        except KeyboardInterrupt as interrupt:  # Ctrl-C or SIGTERM: one line, no traceback
            # A program may say what its interrupted work left (`KeyboardInterrupt(text)`).
            terminated = isinstance(interrupt, Terminated)
            print(f"{os.path.basename(sys.argv[0])}: "
                  + ("stopped by SIGTERM" if terminated else "interrupted")
                  + (f"; {interrupt}" if str(interrupt) else ""), file=sys.stderr)
            return 128 + (signal.SIGTERM if terminated else signal.SIGINT)
        finally:
            # The program's work is written and flushed by now. Python's collections while it
            # tears the interpreter down walk every object TensorFlow's traced graphs left
            # (1-2 s of a short run's exit); frozen objects are left out of them.
            gc.freeze()

    app.run(main_with_one_line_usage_errors, flags_parser=_parse_flags)
