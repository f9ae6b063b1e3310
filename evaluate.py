"""Score a trained model or an export on a split of its dataset: sacreBLEU and chrF on
detokenized beam-search translations.

  python evaluate.py --model_dir=runs/small-de-en                 # test split, beam 4
  python evaluate.py --model_dir=runs/small-de-en --export=runs/small-de-en/export
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from absl import app, flags, logging  # noqa: E402

from tfnmt import cli  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", "runs/small-de-en", "Training directory: its settings.json "
                    "names the dataset; its checkpoints translate unless --export is given.")
flags.DEFINE_string("export", None, "Score this SavedModel (version dir or export_dir) instead.")
flags.DEFINE_string("checkpoint", "auto", "auto | latest | averaged | a checkpoint path.")
flags.DEFINE_enum("split", "test", ["dev", "test"], "Split to score.")
flags.DEFINE_integer("beam_size", 4, "Beam size (checkpoints only).")
flags.DEFINE_float("alpha", 0.6, "Length penalty exponent (checkpoints only).")
flags.DEFINE_integer("batch_size", 32, "Sentences per batch.")
flags.DEFINE_string("output", None, "Also write the translations here, one per line.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    settings_path = os.path.join(FLAGS.model_dir, "settings.json")
    if not os.path.exists(settings_path):
        raise app.UsageError(f"{FLAGS.model_dir} holds no trained model (no settings.json)")
    from tfnmt import serving
    from tfnmt.checkpoints import ModelDirError
    from tfnmt.corpus import CorpusError, read_corpus
    from tfnmt.evaluation import corpus_scores, translate_lines

    with open(settings_path) as f:
        data = json.load(f)["data"]
    files = (data.get("files") or {}).get(FLAGS.split)
    try:
        pairs = list(read_corpus(data["dataset"], FLAGS.split, files, data.get("tfds_data_dir")))
    except (CorpusError, OSError) as error:
        raise app.UsageError(str(error))
    if not pairs:
        raise app.UsageError(f"the {FLAGS.split} split of {data['dataset']}"
                             f"{f' ({files})' if files else ''} holds no sentence pairs to score")
    try:
        translate = serving.load_translate_fn(FLAGS.model_dir, FLAGS.export, FLAGS.beam_size,
                                              FLAGS.alpha, FLAGS.checkpoint)
    except (ModelDirError, OSError) as error:
        raise app.UsageError(str(error))
    hypotheses = translate_lines(translate, [s for s, _ in pairs], FLAGS.batch_size)
    scores = corpus_scores(hypotheses, [t for _, t in pairs])
    if FLAGS.output:
        with open(FLAGS.output, "w", encoding="utf-8") as f:
            f.writelines(h + "\n" for h in hypotheses)
    print(f"{FLAGS.split}: {len(pairs)} sentences | sacreBLEU {scores['bleu']:.2f} | "
          f"chrF {scores['chrf']:.2f}")


if __name__ == "__main__":
    logging.set_verbosity(logging.WARNING)
    cli.run(main)
