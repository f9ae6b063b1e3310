"""Translate text with a trained model (checkpoint), an exported SavedModel, or a CTranslate2
model (export.py --format=ctranslate2, run by CTranslate2 without TensorFlow).

One sentence per line (a line ends at LF or CRLF only), from a file or stdin, to stdout or a
file, one output line per input line, in input order. Input is read and translated in windows
of 64 batches (sentences sorted by length within each, for speed), each written out as soon as
it is done, so a large file streams in bounded memory; typed into a terminal, each line is
translated as it is entered. A line longer than the model reads (max_length - 1 subwords) is
translated from its start, and stderr names it. Input that reads like the model's target
language rather than its source language is said on stderr (by the character pairs of its
first 1,000 lines against those of the model's training text), and so is input that looks like
a TSV of pairs (a tab in 95% of those lines; each line is translated whole).

  echo "Das ist ein Haus." | python translate.py --model_dir=runs/de-en
  python translate.py --export=runs/de-en/export --input=test.de --output=test.en
  python translate.py --model_dir=runs/de-en --plot_attention=plots --input=one.de
  python translate.py --export=runs/de-en/export --input=mono.de --output=mono.en --resume
  python translate.py --export=runs/de-en/ctranslate2 --input=test.de --alpha=1.0

With --resume, a run stopped before the end of its input (Ctrl-C, a batch job's SIGTERM or
SIGKILL) goes on where its --output file ends: the complete translations it holds are kept,
and the input lines after them are translated and appended.

n-best lists (`<line> ||| <translation> ||| <score>`, N lines per input line, best first),
random sampling (back-translation), and scores of given translations (forced decoding:
`<log P(target | source)>\t<count of target subwords + EOS>` per line):

  python translate.py --model_dir=runs/de-en --n_best=4 --beam_size=4 --input=test.de
  python translate.py --model_dir=runs/de-en --sampling_topk=10 --seed=7 --input=mono.de
  python translate.py --export=runs/de-en/export --input=test.de --score_targets=test.en
  python translate.py --model_dir=runs/de-en --input=test.de --target_prefix=starts.en
"""
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from absl import app, flags, logging  # noqa: E402

from tfnmt import cli, text_lines  # noqa: E402
from tfnmt.paths import cannot_write_in, is_ctranslate2  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Training directory to translate with.")
flags.DEFINE_string("export", None, "SavedModel version directory, or an export_dir (newest "
                    "version): beam settings are the export's own; or a CTranslate2 model "
                    "(export.py --format=ctranslate2), which takes the search flags.")
flags.DEFINE_string("checkpoint", "auto", "With --model_dir: auto (averaged at the newest update, "
                    "else best, else latest) | latest | averaged | best | a checkpoint path or "
                    "directory, or one in the model_dir (ckpt-2000, best/ckpt-2000).")
flags.DEFINE_string("input", "-", "Input file, one sentence per line ('-': stdin; .gz: "
                    "compressed).")
flags.DEFINE_string("output", "-", "Output file, UTF-8 ('-': stdout; .gz: compressed).")
flags.DEFINE_bool("resume", False, "Keep the complete translations the --output file holds (of "
                  "a run of this input stopped before its end) and translate the input lines "
                  "after them, appending. Default false: start over.")
flags.DEFINE_integer("beam_size", 4, "With --model_dir or a CTranslate2 model: beam size.")
flags.DEFINE_float("alpha", None, "With --model_dir: length penalty exponent (default: the one "
                   "train.py chose on dev, <model_dir>/decoding.json, else 0.6); with a "
                   "CTranslate2 model, its length_penalty (default: the one export.py kept, else "
                   "1).")
cli.define_beam_stop_flag("With --model_dir: ")
cli.define_no_repeat_flag("With --model_dir or a CTranslate2 model: ")
flags.DEFINE_integer("batch_size", 32, "Sentences per batch.")
flags.DEFINE_integer("n_best", 1, "Translations per sentence, best first (<= --beam_size; "
                     "an export gives at most its own n_best); > 1 writes "
                     "'<line> ||| <translation> ||| <score>' lines.")
flags.DEFINE_string("score_targets", None, "Score these translations (one per --input line) "
                    "instead of translating: writes '<log-probability><TAB><count of subwords "
                    "+ EOS>'.")
flags.DEFINE_string("target_prefix", None, "A file of prefixes, one per --input line (an "
                    "empty line for none): each translation starts with its prefix.")
flags.DEFINE_integer("sampling_topk", None, "With --model_dir or a CTranslate2 model: draw each "
                     "token at random among the k most likely (0: among all), not beam search.")
flags.DEFINE_float("sampling_temperature", 1.0, "With sampling: divide the logits by this "
                   "(default 1: the model's distribution).")
flags.DEFINE_integer("seed", 0, "With sampling: the draws' seed (same input, seed and "
                     "--batch_size: same translations).")
flags.DEFINE_string("plot_attention", None, "With --model_dir: write PNG attention heatmaps "
                    "(per layer, heads side by side) of the first input sentence here.")
flags.register_validator("batch_size", lambda v: v > 0, "--batch_size must be positive")
flags.register_validator("beam_size", lambda v: v > 0, "--beam_size must be positive")
flags.register_validator("n_best", lambda v: v > 0, "--n_best must be positive")
flags.register_validator("seed", lambda v: -2**63 <= v < 2**63,  # a stateless draw's int64
                         "--seed must fit in 64 bits")
cli.register_alpha_validator()
flags.register_validator("sampling_topk", lambda v: v is None or v >= 0,
                         "--sampling_topk must be >= 0")
flags.register_validator("sampling_temperature", lambda v: v > 0,
                         "--sampling_temperature must be positive")


# Sentences are sorted by length within a window of this many batches: enough that batches
# pad little, few enough that output follows input closely and memory stays bounded.
WINDOW_BATCHES = 64
# What --resume leaves out at the end of an --output file at most: a killed run's partial
# line or n-best list (translations are max_length subwords at most).
PARTIAL_OUTPUT_BYTES = 1 << 20
# The first input lines whose language is compared with the model's training sides (and
# which are looked at for tabs).
OTHER_LANGUAGE_SAMPLE = 1000


def check_paths(input_path, output_path):
    """One clear line (UsageError) before any work for an input that cannot be read or an
    output that cannot be written."""
    if input_path != "-":
        if os.path.isdir(input_path):
            raise app.UsageError(f"--input {input_path}: is a directory, not a file")
        if not os.path.exists(input_path):
            raise app.UsageError(f"--input {input_path}: file not found")
        if not os.access(input_path, os.R_OK):
            raise app.UsageError(f"--input {input_path}: not readable")
    if output_path != "-":
        cli.check_output_path(output_path, {"input": input_path,
                                            "score_targets": FLAGS.score_targets,
                                            "target_prefix": FLAGS.target_prefix})


def resume_point(total):
    """How many input lines the --output file holds the output of, for --resume (lines or
    --n_best lists; checked against the input's `total` lines where known); the partial
    output of a killed run after them is left out, said on stderr.

    Returns:
      (input lines done, `text_lines.HeldOutput` to cut the file to).
    """
    if FLAGS.output == "-":
        raise app.UsageError("--resume goes on from where an --output file ends: give --output")
    if os.path.exists(FLAGS.output) and not os.path.isfile(FLAGS.output):
        raise app.UsageError(f"--resume reads what --output holds, and {FLAGS.output} is not a "
                             "file (a pipe or a device): drop --resume")
    held = text_lines.held_output(FLAGS.output, group=FLAGS.n_best)
    lines = f"{held.lines:,} line{'s' if held.lines != 1 else ''}"
    if held.unreadable:
        raise app.UsageError(f"--output {FLAGS.output}: unreadable after {lines} "
                             f"({held.unreadable}): give another --output, or drop --resume")
    if held.extra > PARTIAL_OUTPUT_BYTES:
        raise app.UsageError(f"--output {FLAGS.output} ends in {held.extra:,} bytes after its "
                             f"{lines}, more than a killed run leaves of its output: it is "
                             "not this input's output (give another --output, or drop "
                             "--resume)")
    if total is not None and held.items > total:
        raise app.UsageError(f"--output {FLAGS.output} holds the output of {held.items:,} input "
                             f"lines, more than the input's {total:,}: it is not this input's "
                             "output (give another --output, or drop --resume)")
    if FLAGS.n_best > 1 and held.items and not held.last.startswith(f"{held.items - 1} ||| "):
        raise app.UsageError(f"--output {FLAGS.output}: its {lines} are not the --n_best="
                             f"{FLAGS.n_best} lists of the first {held.items:,} input lines "
                             f"(line {held.lines:,} would start '{held.items - 1} ||| '): give "
                             "another --output, or drop --resume")
    if held.damaged or held.extra:
        what = "a damaged gzip stream" if held.damaged else f"{held.extra:,} bytes"
        print(f"translate.py: --output {FLAGS.output} ends in {what} after the output of its "
              "first input lines, left out: those lines are translated again", file=sys.stderr)
    return held.items, held


def skip_lines(lines, count):
    """Reads the first `count` of `lines` (input lines done by the run --resume goes on from).

    Raises:
      app.UsageError: the input ends before (stdin or a pipe; a file is counted before).
    """
    for skipped in range(count):
        if next(lines, None) is None:
            raise app.UsageError(f"the input ends after {skipped:,} line"
                                 f"{'s' if skipped != 1 else ''}, and --output "
                                 f"{FLAGS.output} holds the output of {count:,}: it is not this "
                                 "input's output (give another --output, or drop --resume)")


def score_lines(score, pairs):
    """'<log-probability>\t<length>' of each target as a translation of its source."""
    import numpy as np

    log_probs, lengths = score([s for s, _ in pairs], [t for _, t in pairs])
    return [f"{p:.6f}\t{n}" for p, n in zip(np.asarray(log_probs).tolist(),
                                            np.asarray(lengths).tolist())]


def n_best_lines(translate_n_best, numbered_lines):
    """Moses-style n-best lines of (input line number, line) items: a list of --n_best
    '<number> ||| <translation> ||| <score>' lines per item, best first."""
    import numpy as np

    translations, scores = translate_n_best([line for _, line in numbered_lines])  # [B, N]
    given = translations.shape[1]
    if given < FLAGS.n_best:
        raise app.UsageError(f"the export gives {given} translation{'s' if given > 1 else ''} "
                             f"per sentence, fewer than --n_best={FLAGS.n_best} (export.py "
                             "--n_best sets how many, up to its --beam_size)")
    return [[f"{number} ||| {t.decode('utf-8')} ||| {v:.6f}"
             for t, v in zip(texts[:FLAGS.n_best], values[:FLAGS.n_best])]
            for (number, _), texts, values in zip(numbered_lines, np.asarray(translations),
                                                  np.array(scores))]


def plot_attention(model_dir, checkpoint, sentence, translation, directory):
    import tensorflow as tf

    from tfnmt.checkpoints import load_model
    from tfnmt.inference.serving import TranslationModule
    from tfnmt.training.summaries import attention_pictures, teacher_forced_inputs

    model, vocab, _ = load_model(model_dir, checkpoint)
    module = TranslationModule(model, vocab, n_best=1)
    source_ids, target_in = teacher_forced_inputs(
        module.source_ids(tf.constant([sentence])),
        module.target_tokenizer.tokenize([translation]), model.max_length)
    os.makedirs(directory, exist_ok=True)
    pictures = attention_pictures(model, source_ids, target_in,
                                  module.source_tokenizer.id_to_string,
                                  module.target_tokenizer.id_to_string)
    for name, image in pictures.items():
        path = os.path.join(directory, name.replace("/", "_") + ".png")
        tf.io.write_file(path, tf.io.encode_png(image))
        print(f"wrote {path}", file=sys.stderr)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if bool(FLAGS.model_dir) == bool(FLAGS.export):
        raise app.UsageError("give exactly one of --model_dir and --export")
    if FLAGS.plot_attention and not FLAGS.model_dir:
        raise app.UsageError("--plot_attention needs --model_dir (weights come from the model)")
    if FLAGS.plot_attention and (FLAGS.n_best > 1 or FLAGS.score_targets or FLAGS.target_prefix):
        raise app.UsageError("--plot_attention plots the first sentence's translation: drop "
                             "--n_best, --score_targets and --target_prefix")
    sampling = None if FLAGS.sampling_topk is None else {
        "temperature": FLAGS.sampling_temperature, "top_k": FLAGS.sampling_topk,
        "seed": FLAGS.seed}
    for flag in ("sampling_temperature", "seed"):
        if FLAGS[flag].present and not sampling:
            raise app.UsageError(f"--{flag} is for sampling: give --sampling_topk (0: among "
                                 "all words)")
    ctranslate2 = bool(FLAGS.export) and is_ctranslate2(FLAGS.export)
    if sampling and FLAGS.export and not ctranslate2:
        raise app.UsageError("sampling needs --model_dir or a CTranslate2 model (SavedModel "
                             "exports search with beams)")
    if FLAGS.export:
        cli.refuse_checkpoint_search_flags(FLAGS.export)
    if sampling and FLAGS.n_best > 1:
        raise app.UsageError("sampling draws one translation per sentence: drop --n_best")
    if sampling and FLAGS.no_repeat_ngram_size:
        raise app.UsageError("--no_repeat_ngram_size is a beam search rule: drop it or "
                             "--sampling_topk")
    if (FLAGS.model_dir or ctranslate2) and FLAGS.n_best > FLAGS.beam_size:
        raise app.UsageError(f"--n_best={FLAGS.n_best} needs --beam_size >= {FLAGS.n_best}")
    if FLAGS.score_targets and (FLAGS.n_best > 1 or sampling):
        raise app.UsageError("--score_targets scores the given translations, translating "
                             "nothing: drop --n_best and --sampling_topk")
    check_paths(FLAGS.input, FLAGS.output)
    if FLAGS.plot_attention:  # written after the first window's translations
        if os.path.exists(FLAGS.plot_attention) and not os.path.isdir(FLAGS.plot_attention):
            raise app.UsageError(f"--plot_attention={FLAGS.plot_attention} is a file, not a "
                                 "directory")
        if reason := cannot_write_in(FLAGS.plot_attention):
            raise app.UsageError(f"--plot_attention={FLAGS.plot_attention}: cannot write in it "
                                 f"({reason})")
    for flag in ("score_targets", "target_prefix"):
        if FLAGS[flag].value and not os.path.exists(FLAGS[flag].value):
            raise app.UsageError(f"--{flag} {FLAGS[flag].value}: file not found")
        if FLAGS[flag].value and os.path.isdir(FLAGS[flag].value):
            raise app.UsageError(f"--{flag} {FLAGS[flag].value}: is a directory, not a file")
    if FLAGS.target_prefix and (FLAGS.n_best > 1 or FLAGS.score_targets):
        raise app.UsageError("--target_prefix gives one translation per line: drop --n_best "
                             "and --score_targets")
    paired = {flag: FLAGS[flag].value for flag in ("score_targets", "target_prefix")
              if FLAGS[flag].value}
    # Counted before any work where that does not consume them (not a pipe: `<(zcat …)`).
    total = text_lines.count_lines(FLAGS.input) if os.path.isfile(FLAGS.input) else None
    for flag, path in paired.items():
        if total is not None and os.path.isfile(path) and \
                (count := text_lines.count_lines(path)) != total:
            raise app.UsageError(f"--{flag} has {count} line{'s' if count != 1 else ''} for "
                                 f"{total} input line{'s' if total != 1 else ''}")
    if "score_targets" in paired and total is not None and os.path.isfile(FLAGS.score_targets):
        check_in_step(FLAGS.input, FLAGS.score_targets)
    done, held = resume_point(total) if FLAGS.resume else (0, None)
    if done and done == total:
        print(f"translate.py: --output {FLAGS.output} holds the output of all {total:,} input "
              "lines already", file=sys.stderr)
        return 0
    cli.check_model_path(FLAGS.model_dir, FLAGS.export)
    from tfnmt.inference import loading

    loading.skip_graph_rewrites(FLAGS.export)
    try:
        signatures = loading.load_signatures(FLAGS.model_dir, FLAGS.export, FLAGS.beam_size,
                                             FLAGS.alpha, FLAGS.checkpoint,
                                             n_best=FLAGS.n_best, sampling=sampling,
                                             beam_stop=FLAGS.beam_stop,
                                             no_repeat_ngram_size=FLAGS.no_repeat_ngram_size)
    except loading.load_errors(FLAGS.export) as error:
        raise app.UsageError(str(error))
    for flag, signature in (("score_targets", "score"),
                            ("target_prefix", "translate_with_prefix")):
        if flag in paired and signature not in signatures:
            raise app.UsageError(f"{FLAGS.export} has no {signature} signature (export it "
                                 "again)")
    # Each file's lines that held invalid UTF-8 (read as U+FFFD, as a served export reads them).
    input_name = "standard input" if FLAGS.input == "-" else FLAGS.input
    invalid = {input_name: []}
    lines = text_lines.iter_lines(FLAGS.input, errors="replace", invalid=invalid[input_name])
    for flag, path in paired.items():
        name = f"--{flag} {path}"
        invalid[name] = []
        lines = text_lines.paired_lines(lines, path, flag, invalid=invalid[name])
    if done:
        print(f"translate.py: --output {FLAGS.output} holds the output of the first {done:,} "
              "input lines: going on from the next", file=sys.stderr)
        skip_lines(lines, done)
        for numbers in invalid.values():  # said by the run that translated them
            numbers.clear()
    if held is not None:
        text_lines.keep_held(FLAGS.output, held)
    # A terminal's lines are translated as they are typed.
    interactive = FLAGS.input == "-" and sys.stdin.isatty()
    if interactive:
        print("translate.py: type a sentence per line (Ctrl-D ends)", file=sys.stderr)
    window_size = 1 if interactive else FLAGS.batch_size * WINDOW_BATCHES
    writer = text_lines.LineWriter(FLAGS.output, append=FLAGS.resume)
    lines_read, start = done, time.monotonic()
    try:
        for window_number, window in enumerate(text_lines.windows(lines, window_size)):
            sources = [line if isinstance(line, str) else line[0] for line in window]
            if window_number == 0:
                name = "the input" if FLAGS.input == "-" else f"--input {FLAGS.input}"
                for message in (tabbed_lines(sources[:OTHER_LANGUAGE_SAMPLE], name),
                                loading.other_language(FLAGS.model_dir, FLAGS.export,
                                                       sources[:OTHER_LANGUAGE_SAMPLE], name)):
                    if message:
                        print(f"translate.py: {message}", file=sys.stderr)
            output = translate_window(signatures, window, lines_read)
            writer.write(output)
            first_line, lines_read = lines_read + 1, lines_read + len(window)
            for name, numbers in invalid.items():  # those of this window, read by now
                if message := text_lines.invalid_utf8_message(numbers):
                    print(f"translate.py: {name}: {message}", file=sys.stderr)
                numbers.clear()
            if message := loading.long_sources(
                    signatures, sources, first_line=first_line,
                    output="score" if FLAGS.score_targets else "translation"):
                print(f"translate.py: {message}", file=sys.stderr)
            if not interactive and len(window) == window_size and lines_read != total:
                print(progress(lines_read, total, time.monotonic() - start, done),
                      file=sys.stderr)
            if FLAGS.plot_attention and window_number == 0:
                plot_attention(FLAGS.model_dir, FLAGS.checkpoint, window[0], output[0],
                               FLAGS.plot_attention)
        if lines_read == 0:
            writer.write([])  # no input: an empty output file
    except BrokenPipeError:  # the reader went away (`| head`): stop as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt as interrupt:  # Ctrl-C, SIGTERM: what the output file holds
        if FLAGS.output == "-" or not (writer.written or done):
            raise
        of_total = "" if total is None else f" of {total:,}"
        raise type(interrupt)(f"{FLAGS.output} holds the output of the first {lines_read:,}"
                              f"{of_total} input lines (--resume goes on from there)") from None
    finally:
        writer.close()


def tabbed_lines(lines, name):
    """A line saying that `lines` (the input's first) look like a TSV of pairs
    (`text_lines.tabbed_pairs`), each of which is translated whole, tab and all; else None."""
    if not (tabbed := text_lines.tabbed_pairs(lines)):
        return None
    return (f"{name}: {tabbed} Each line is translated whole, tab and all (`cut -f1` gives "
            "the first column)")


def check_in_step(input_path, targets_path):
    """One line (app.UsageError) where the translations to score go out of step with their
    input lines (`alignment.first_out_of_step`): each would be scored against another's
    source."""
    from tfnmt.data.alignment import describe, first_out_of_step

    pairs = zip(text_lines.iter_lines(input_path, errors="replace"),
                text_lines.iter_lines(targets_path, errors="replace"))
    if found := first_out_of_step(pairs):
        raise app.UsageError(f"--input and --score_targets: "
                             f"{describe(found, ('--input', '--score_targets'))}")


def progress(lines_read, total, seconds, first=0):
    """A progress line on stderr between windows of a long input (`total`: its line count,
    None for stdin; `first`: the lines a resumed run started after)."""
    rate = (lines_read - first) / max(seconds, 1e-9)
    done = f"{lines_read:,} lines" if total is None else (
        f"{lines_read:,} of {total:,} lines, {(total - lines_read) / rate:.0f} s left")
    return f"translate.py: {done} ({rate:.1f} lines/s)"


def translate_window(signatures, window, first_number):
    """The output lines of a window of input lines (of (line, paired line) pairs with
    --score_targets or --target_prefix) that starts at input line `first_number`."""
    from tfnmt.inference.batching import in_length_order, translate_lines

    if FLAGS.score_targets:
        return in_length_order(lambda pairs: score_lines(signatures["score"], pairs), window,
                               FLAGS.batch_size, length=lambda pair: len(pair[0]))
    if FLAGS.n_best > 1:
        numbered = list(enumerate(window, first_number))
        return [line for item_lines in in_length_order(
            lambda batch: n_best_lines(signatures["translate_n_best"], batch), numbered,
            FLAGS.batch_size, length=lambda item: len(item[1])) for line in item_lines]
    if FLAGS.target_prefix:
        translate = signatures["translate_with_prefix"]
        return translate_lines(
            lambda pairs: translate([s for s, _ in pairs], [p for _, p in pairs]),
            window, FLAGS.batch_size, length=lambda pair: len(pair[0]))
    return translate_lines(signatures["serving_default"], window, FLAGS.batch_size)


def run():
    """The `translate.py` / `tfnmt-translate` command."""
    logging.set_verbosity(logging.WARNING)
    cli.run(main, __doc__)


if __name__ == "__main__":
    run()
