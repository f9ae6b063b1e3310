"""Decoding speed of an exported SavedModel on a split: sentences/s and target tokens/s.

Target tokens are SentencePiece pieces of the outputs (as OpenNMT-tf counts them). Sentences
are batched by length (as translate.py does); one batch is decoded first as warm-up.

  python bench/decode.py --export=runs/small-de-en/export/1 --batch_size=32
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("export", None, "SavedModel version directory (or export_dir).", required=True)
flags.DEFINE_string("model_dir", "runs/small-de-en", "Training dir: dataset and spm.model.")
flags.DEFINE_enum("split", "test", ["dev", "test"], "Split to decode.")
flags.DEFINE_integer("batch_size", 32, "Sentences per call.")
flags.DEFINE_integer("limit", 0, "Decode only the first N sentences (0: all).")


def main(argv):
    del argv
    import tensorflow as tf

    from tfnmt import serving
    from tfnmt.corpus import read_corpus
    from tfnmt.evaluation import translate_lines
    from tfnmt.tokenizer import Tokenizer

    with open(os.path.join(FLAGS.model_dir, "settings.json")) as f:
        data = json.load(f)["data"]
    sources = [s for s, _ in read_corpus(data["dataset"], FLAGS.split,
                                         (data.get("files") or {}).get(FLAGS.split),
                                         data.get("tfds_data_dir"))]
    sources = sources[:FLAGS.limit] if FLAGS.limit else sources
    translate = serving.load_translate_fn(export=FLAGS.export)
    translate_lines(translate, sources[:FLAGS.batch_size], FLAGS.batch_size)  # warm-up
    start = time.perf_counter()
    outputs = translate_lines(translate, sources, FLAGS.batch_size)
    elapsed = time.perf_counter() - start
    tokenizer = Tokenizer(os.path.join(FLAGS.model_dir, "spm.model"))
    pieces = int(tf.reduce_sum(tokenizer.tokenize(outputs).row_lengths()))
    print(json.dumps({"export": FLAGS.export, "batch_size": FLAGS.batch_size,
                      "sentences": len(sources), "seconds": round(elapsed, 2),
                      "sentences_per_s": round(len(sources) / elapsed, 2),
                      "target_tokens_per_s": round(pieces / elapsed, 1)}))


if __name__ == "__main__":
    app.run(main)
