"""Translate text with a trained model (checkpoint) or an exported SavedModel.

One sentence per line (a line ends at LF or CRLF only), from a file or stdin, to stdout or a
file, one output line per input line; sentences are batched by length for speed and written
back in input order.

  echo "Das ist ein Haus." | python translate.py --model_dir=runs/de-en
  python translate.py --export=runs/de-en/export --input=test.de --output=test.en
  python translate.py --model_dir=runs/de-en --plot_attention=plots --input=one.de
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from absl import app, flags, logging  # noqa: E402

from tfnmt import cli  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Training directory to translate with.")
flags.DEFINE_string("export", None, "SavedModel version directory, or an export_dir (newest "
                    "version); beam settings are the export's own.")
flags.DEFINE_string("checkpoint", "auto", "With --model_dir: auto (averaged, else best, else "
                    "latest) | latest | averaged | best | a checkpoint path.")
flags.DEFINE_string("input", "-", "Input file, one sentence per line ('-': stdin).")
flags.DEFINE_string("output", "-", "Output file ('-': stdout).")
flags.DEFINE_integer("beam_size", 4, "With --model_dir: beam size.")
flags.DEFINE_float("alpha", 0.6, "With --model_dir: length penalty exponent.")
flags.DEFINE_integer("batch_size", 32, "Sentences per batch.")
flags.DEFINE_string("plot_attention", None, "With --model_dir: write PNG attention heatmaps "
                    "(per layer, heads side by side) of the first input sentence here.")
flags.register_validator("batch_size", lambda v: v > 0, "--batch_size must be positive")
flags.register_validator("beam_size", lambda v: v > 0, "--beam_size must be positive")


def read_lines(path):
    """The input's lines, split at "\\n" only (a "\\r" before it is dropped): other line breaks
    (VT, FF, NEL, U+2028, a lone CR...) stay inside their line, so there is one output line
    per input line. Invalid UTF-8 bytes become U+FFFD, as in the exported graph."""
    with (open(path, "rb") if path != "-" else sys.stdin.buffer) as f:
        text = f.read().decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines[-1] == "":  # the last line's newline, or no input at all
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def write_lines(path, lines):
    """One line per item; a line break inside an item becomes a space."""
    text = "".join(line.replace("\r", " ").replace("\n", " ") + "\n" for line in lines)
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)


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
        directory = os.path.dirname(os.path.abspath(output_path))
        if os.path.isdir(output_path):
            raise app.UsageError(f"--output {output_path}: is a directory, not a file")
        if not os.path.isdir(directory):
            raise app.UsageError(f"--output {output_path}: directory {directory} does not exist")
        if not os.access(directory, os.W_OK):
            raise app.UsageError(f"--output {output_path}: directory {directory} is not writable")


def plot_attention(model_dir, checkpoint, sentence, translation, directory):
    import tensorflow as tf

    from tfnmt.checkpoints import load_model
    from tfnmt.inference.serving import TranslationModule
    from tfnmt.training.summaries import attention_weights, heads_side_by_side

    model, proto, _ = load_model(model_dir, checkpoint)
    module = TranslationModule(model, proto, n_best=1)
    source_ids = module.source_ids(tf.constant([sentence]))
    target = module.tokenizer.tokenize([translation]).to_tensor()
    target_in = tf.concat([tf.fill([1, 1], 2), tf.cast(target, tf.int32)], axis=1)
    os.makedirs(directory, exist_ok=True)
    for name, weights in attention_weights(model, source_ids, target_in).items():
        path = os.path.join(directory, name.replace("/", "_") + ".png")
        tf.io.write_file(path, tf.io.encode_png(heads_side_by_side(weights, pixel=8)))
        print(f"wrote {path}", file=sys.stderr)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if bool(FLAGS.model_dir) == bool(FLAGS.export):
        raise app.UsageError("give exactly one of --model_dir and --export")
    if FLAGS.plot_attention and not FLAGS.model_dir:
        raise app.UsageError("--plot_attention needs --model_dir (weights come from the model)")
    check_paths(FLAGS.input, FLAGS.output)
    from tfnmt.checkpoints import ModelDirError
    from tfnmt.inference import serving
    from tfnmt.inference.evaluation import translate_lines

    lines = read_lines(FLAGS.input)
    try:
        translate = serving.load_translate_fn(FLAGS.model_dir, FLAGS.export, FLAGS.beam_size,
                                              FLAGS.alpha, FLAGS.checkpoint)
    except (ModelDirError, FileNotFoundError, OSError) as error:
        raise app.UsageError(str(error))
    translations = translate_lines(translate, lines, FLAGS.batch_size)
    write_lines(FLAGS.output, translations)
    if FLAGS.plot_attention and lines:
        plot_attention(FLAGS.model_dir, FLAGS.checkpoint, lines[0], translations[0],
                       FLAGS.plot_attention)


if __name__ == "__main__":
    logging.set_verbosity(logging.WARNING)
    cli.run(main)
