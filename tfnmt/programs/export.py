"""Export a trained tfnmt model as a versioned SavedModel for TensorFlow Serving.

Writes <export_dir>/<version>/ whose `serving_default` signature takes raw sentences (string [B])
and returns `translations` (string [B]) and `scores` (float32 [B]); `translate_n_best` returns
[B, n_best] of each. Tokenization, beam search and detokenization run inside the graph, with
core TensorFlow and tensorflow-text ops only. Loading it needs `import tensorflow_text` first.
Before the version is published, TensorFlow's C++ loader (the one TF Serving uses) loads it and
both signatures translate two sentences; if that fails, nothing is published (exit code 1).

With --format=ctranslate2 it writes a CTranslate2 model instead
(tfnmt/inference/ctranslate2_export.py):
<export_dir> (default <model_dir>/ctranslate2, or ctranslate2-<quantization>) with spm.model beside
CTranslate2's files, checked by translating two sentences with CTranslate2 before it is published;
its length_penalty (translate.py's and evaluate.py's default for it) is chosen on the model_dir's
dev split unless --alpha gives one.

  python export.py --model_dir=runs/de-en                  # averaged weights if any
  python export.py --model_dir=runs/de-en --checkpoint=latest --beam_size=5
  python export.py --model_dir=runs/de-en --format=ctranslate2 --quantization=int8
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from absl import app, flags, logging  # noqa: E402

from tfnmt import cli, cpu_kernels  # noqa: E402
from tfnmt.inference.decoding_threads import PARALLEL_SEARCHES  # noqa: E402
from tfnmt.paths import (CTRANSLATE2, DEFAULT_MODEL_DIR, EXPORT, cannot_write_in,  # noqa: E402
                         is_disk_full, read_settings)

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", DEFAULT_MODEL_DIR, "Training directory (settings.json, "
                    "spm.model, checkpoints/, averaged/, best/).")
flags.DEFINE_string("checkpoint", "auto", "'auto' (the averaged checkpoint of the newest "
                    "update if there is one, else the best, else the latest), 'latest', "
                    "'averaged', 'best' (best dev metric), a checkpoint path prefix or "
                    "directory, or one in the model_dir (ckpt-2000, best/ckpt-2000).")
flags.DEFINE_enum("format", "saved_model", ["saved_model", "ctranslate2"], "saved_model: for "
                  "TensorFlow Serving (default); ctranslate2: for the CTranslate2 engine.")
flags.DEFINE_string("export_dir", None, "Where versions are written (default <model_dir>/export); "
                    "with --format=ctranslate2 the new directory to write (default "
                    "<model_dir>/ctranslate2[-<quantization>]).")
flags.DEFINE_enum("quantization", "none", ["none", "int8", "int8_float32", "int16", "float16",
                                           "bfloat16"],
                  "--format=ctranslate2 only: the stored weights' type (default none: float32).")
flags.DEFINE_integer("version", None, "Version number (default: the next integer); an "
                     "existing version is never overwritten.")
flags.DEFINE_integer("beam_size", 4, "Beam size (paper: 4).")
flags.DEFINE_float("alpha", None, "A SavedModel's GNMT length penalty exponent (default: the "
                   "one train.py chose on dev, in <model_dir>/decoding.json, else the paper's "
                   "0.6); a CTranslate2 model's default length_penalty (default: chosen on the "
                   "model_dir's dev split, else CTranslate2's 1).")
cli.define_beam_stop_flag()
cli.define_no_repeat_flag("A SavedModel's rule, a CTranslate2 model's default (tfnmt.json): ")
flags.DEFINE_integer("max_decode_length", 0, "Cap on output subwords (0: source length + 50).")
flags.DEFINE_enum("matmul_dtype", "auto", ["auto", "float32", "bfloat16"], "Dtype of the "
                  "weight matmuls: float32, bfloat16, or auto (default): bfloat16 where the "
                  "serving CPU has native bf16 and times it faster, decided by each server "
                  "process on its first request. For GPUs choose float32 or bfloat16.")
flags.DEFINE_integer("n_best", None, "Hypotheses returned by the translate_n_best signature, "
                     "best first, at most --beam_size (default: --beam_size).")
flags.DEFINE_integer("parallel_searches", PARALLEL_SEARCHES, "Groups a batch is split into on a "
                     "CPU, searched at the same time to keep its cores busy; a server with a GPU "
                     f"searches one group. Translations are the same. Default {PARALLEL_SEARCHES}.")
flags.DEFINE_integer("chunk_size", 64, "Most sentences searched at once (fewer where a CPU "
                     "server's free memory is short): a larger request is translated in chunks, "
                     "one after another (docs/serving.md).")
flags.DEFINE_bool("check", True, "Before publishing, load the export and translate two "
                  "sentences: a SavedModel with TensorFlow's C++ loader (as TF Serving does), "
                  "each signature; a CTranslate2 model with CTranslate2.")
flags.register_validator("version", lambda v: v is None or v >= 0, "--version must be >= 0")
flags.register_validator("beam_size", lambda v: v >= 1, "--beam_size must be >= 1")
flags.register_validator("chunk_size", lambda v: v >= 1, "--chunk_size must be >= 1")
flags.register_validator("max_decode_length", lambda v: v >= 0, "--max_decode_length must be >= 0")
cli.register_alpha_validator()
flags.register_validator("parallel_searches", lambda v: v >= 1, "--parallel_searches must be >= 1")


SAVED_MODEL_ONLY = ("version", "beam_size", "beam_stop", "max_decode_length",
                    "matmul_dtype", "n_best", "parallel_searches", "chunk_size")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    n_best = FLAGS.beam_size if FLAGS.n_best is None else FLAGS.n_best
    if not 1 <= n_best <= FLAGS.beam_size:
        raise app.UsageError(f"--n_best must be in [1, --beam_size={FLAGS.beam_size}]")
    if FLAGS.format != "ctranslate2" and FLAGS["quantization"].present:
        raise app.UsageError("--quantization needs --format=ctranslate2")
    if FLAGS.format == "ctranslate2":
        for name in SAVED_MODEL_ONLY:
            if FLAGS[name].present:
                raise app.UsageError(f"--{name} is for SavedModel exports; CTranslate2 takes its "
                                     "decoding options when it translates")
    # Said before TensorFlow loads: a missing model, an export_dir that is a file or cannot be
    # written in, a version (or a CTranslate2 directory) that exists.
    cli.check_model_path(FLAGS.model_dir, export=None)
    export_dir = FLAGS.export_dir or default_export_dir()
    if os.path.exists(export_dir) and not os.path.isdir(export_dir):
        raise app.UsageError(f"--export_dir={export_dir} is a file, not a directory"
                             if FLAGS.export_dir else f"{export_dir} is a file, not a directory: "
                             "give --export_dir")
    version_dir = None if FLAGS.version is None else os.path.join(export_dir, str(FLAGS.version))
    if version_dir and os.path.exists(version_dir):
        raise app.UsageError(f"{version_dir} exists; versions are never overwritten")
    if FLAGS.format == "ctranslate2" and os.path.exists(export_dir):
        raise app.UsageError(f"{os.path.abspath(export_dir)} exists; give another --export_dir "
                             "or remove it")
    if reason := cannot_write_in(export_dir):
        raise app.UsageError(f"{export_dir}: cannot write in it ({reason})"
                             + ("" if FLAGS.export_dir else ": give --export_dir"))
    import tensorflow as tf

    if FLAGS.format != "ctranslate2" and FLAGS.matmul_dtype == "bfloat16" and FLAGS.check \
            and not tf.config.list_physical_devices("GPU"):
        reason = cpu_kernels.bf16_abort_reason()
        if reason:
            raise app.UsageError("--matmul_dtype=bfloat16: the check would run it here, but "
                                 f"{reason}; lift the cap, or give --check=false to export "
                                 "for a server without it")
    from tfnmt import checkpoints
    from tfnmt.inference import length_penalty, search_memory
    from tfnmt.inference.saved_model import ExportCheckError, export_saved_model
    from tfnmt.inference.serving import TranslationModule

    try:
        model, vocab, path = checkpoints.load_model(FLAGS.model_dir, FLAGS.checkpoint)
    except checkpoints.ModelDirError as error:
        raise app.UsageError(str(error))
    no_repeat = FLAGS.no_repeat_ngram_size
    if no_repeat is None:
        no_repeat, source = length_penalty.default_no_repeat(FLAGS.model_dir)
        if no_repeat:
            print(f"no repeated sequence of {no_repeat} subwords ({source})", flush=True)
    if FLAGS.format == "ctranslate2":
        return export_ctranslate2(model, vocab, path, export_dir, no_repeat)
    try:  # a beam of which one sentence does not fit here: the check would be killed
        search_memory.check_beam(model.settings, FLAGS.beam_size)
    except search_memory.SearchMemoryError as error:
        raise app.UsageError(str(error))
    alpha, source = (FLAGS.alpha, "--alpha") if FLAGS.alpha is not None \
        else length_penalty.default_alpha(FLAGS.model_dir)
    print(f"length penalty {alpha:g} ({source})", flush=True)
    module = TranslationModule(model, vocab, FLAGS.beam_size, alpha,
                               FLAGS.max_decode_length, n_best,
                               parallel_searches=FLAGS.parallel_searches,
                               matmul_dtype=FLAGS.matmul_dtype, chunk_size=FLAGS.chunk_size,
                               beam_stop=FLAGS.beam_stop,
                               no_repeat_ngram_size=no_repeat,
                               memory_budget=search_memory.SERVING_MACHINE)
    try:
        final = export_saved_model(module, export_dir, FLAGS.version, check=FLAGS.check,
                                   extra_files=side_profiles(FLAGS.model_dir))
    except FileExistsError as error:
        raise app.UsageError(str(error))
    except (ExportCheckError, OSError, tf.errors.OpError) as error:  # e.g. a full disk
        print(f"export.py: nothing published: {failure(error, export_dir)}", file=sys.stderr)
        return 1
    matmuls = ("bfloat16 where the serving CPU times it faster, else float32"
               if FLAGS.matmul_dtype == "auto" else FLAGS.matmul_dtype)
    repeats = (f"; no translation repeats a sequence of {no_repeat} subwords"
               if no_repeat else "")
    print(f"exported {path} to {final} (weight matmuls: {matmuls}{repeats})")


def failure(error, export_dir):
    """Why an export failed, in one line: a full disk named as such (TensorFlow's message names
    a temporary file that is gone by now), else the error's first line."""
    if is_disk_full(error):
        return (f"no space left on the device to write {export_dir} (free space and export "
                "again)")
    return str(error).splitlines()[0]


def side_profiles(model_dir):
    """The model_dir's character pairs of its training text (`side_order.PROFILE_FILE`:
    translate.py and evaluate.py tell input in the target language by them), as a list of its
    path; counted and written first for a model trained before train.py kept them
    (`side_order.keep_profiles`); else an empty list."""
    from tfnmt.data.side_order import keep_profiles

    kept = keep_profiles(model_dir, read_settings(model_dir))
    return [kept] if kept else []


def ctranslate2_quantization():
    """--quantization as ctranslate2_export takes it: None for float32 weights."""
    return None if FLAGS.quantization == "none" else FLAGS.quantization


def default_export_dir():
    """Where --export_dir defaults to: <model_dir>/export for a SavedModel, else
    <model_dir>/ctranslate2[-<quantization>]."""
    if FLAGS.format != "ctranslate2":
        return os.path.join(FLAGS.model_dir, EXPORT)
    quantization = ctranslate2_quantization()
    return os.path.join(FLAGS.model_dir, CTRANSLATE2 + (f"-{quantization}" if quantization else ""))


def ctranslate2_dev_pairs():
    """((sources, references, sacreBLEU tokenization) of the model_dir's dev split, to choose
    a CTranslate2 model's length_penalty on (`ctranslate2_translator.choice_pairs`), how
    many); or (None, why not)."""
    from tfnmt.data.corpus import CorpusError, read_split
    from tfnmt.inference.ctranslate2_translator import choice_pairs
    from tfnmt.training.evaluator import run_bleu_tokenization

    if not FLAGS.check:
        return None, "--check=false runs nothing here"
    settings = read_settings(FLAGS.model_dir) or {}
    data = settings.get("data") or {}
    if not data.get("dataset") or (data["dataset"] == "files"
                                   and not (data.get("files") or {}).get("dev")):
        return None, "the model_dir names no dev split"
    try:
        pairs = list(read_split(data, "dev", download=False))
    except (CorpusError, OSError) as error:
        return None, f"its dev split does not read here: {str(error).splitlines()[0]}"
    if not pairs:
        return None, "its dev split holds no sentence pairs"
    tokenize = run_bleu_tokenization(settings, pairs)[0]
    chosen = choice_pairs(pairs)
    return ([s for s, _ in chosen], [t for _, t in chosen], tokenize), (
        f"{len(chosen):,} of its {len(pairs):,} sentences" if len(chosen) < len(pairs) else
        f"{len(pairs):,} sentences")


def export_ctranslate2(model, vocab, path, export_dir, no_repeat_ngram_size):
    from tfnmt.inference import ctranslate2_export
    from tfnmt.inference.ctranslate2_translator import model_settings

    quantization = ctranslate2_quantization()
    dev_pairs = None
    if FLAGS.alpha is None:
        dev_pairs, said = ctranslate2_dev_pairs()
        print(f"choosing the length penalty on the dev split ({said})" if dev_pairs else
              f"length penalty 1 (CTranslate2's default: {said})", flush=True)
    try:
        final = ctranslate2_export.export_ctranslate2(
            model, vocab, export_dir, quantization, check=FLAGS.check,
            extra_files=side_profiles(FLAGS.model_dir),
            no_repeat_ngram_size=no_repeat_ngram_size, length_penalty=FLAGS.alpha,
            dev_pairs=dev_pairs)
    except FileExistsError as error:
        raise app.UsageError(str(error))
    except (ctranslate2_export.CTranslate2ExportError, OSError) as error:
        print(f"export.py: nothing published: {failure(error, export_dir)}", file=sys.stderr)
        return 1
    kept = model_settings(final)
    if kept.get("length_penalty_chosen_on") == "dev":
        print(f"length penalty {kept['length_penalty']:g}, chosen on dev (sacreBLEU "
              + ", ".join(f"{a} {b:.2f}" for a, b in kept["dev_bleu"].items()) + ")")
    defaults = [f"{name}={kept[name]:g}" for name in ("length_penalty", "no_repeat_ngram_size")
                if name in kept]
    rule = (f" and {' and '.join(defaults)} (kept as translate.py's "
            f"default{'s' if len(defaults) > 1 else ''})" if defaults else "")
    print(f"exported {path} to {final} (CTranslate2, weights in {quantization or 'float32'}); "
          f"translate.py --export={final} runs it; in your own code translate with "
          f"max_input_length={model.max_length} and max_decoding_length={model.max_length}"
          f"{rule}: the model has {model.max_length} positions")


def run():
    """The `export.py` / `tfnmt-export` command."""
    logging.set_verbosity(logging.WARNING)
    cli.run(main, __doc__)


if __name__ == "__main__":
    run()
