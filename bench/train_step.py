"""Time of one training step on a fixed batch: the Trainer's step (forward, backward, Adam) on
one [batch, length] batch of random ids, repeated, so neither the input pipeline nor changing
shapes enter the figure. For before/after comparisons of the step's own work (bench/README.md
"What each change bought"); bench/train.py gives the tokens/s over real data. Prints one JSON
line: the median and fastest step in ms, and tokens/s at the median.

  python bench/train_step.py                       # small, bf16 where native, [128, 32]
  python bench/train_step.py --profile_dir=/tmp/step-trace
"""
import json
import statistics
import time

import common
from common import build_trainer, cpu_description, define_trainer_flags

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
define_trainer_flags()
flags.adopt_module_key_flags(common)  # listed by --help with the flags below
flags.DEFINE_integer("batch", 128, "Sentences per batch.")
flags.DEFINE_integer("length", 32, "Source and target length (no padding).")
flags.DEFINE_integer("vocab_size", 8000, "Vocabulary size (the bench corpus's).")
flags.DEFINE_integer("warmup", 4, "Untimed steps first (tracing).")
flags.DEFINE_integer("steps", 12, "Timed steps.")
flags.DEFINE_string("profile_dir", None, "Also write a tf.profiler trace of 5 more steps.")


def main(argv):
    del argv
    import tensorflow as tf

    from tfnmt.training.distribute import batch_iterator
    from tfnmt.training.precision import resolve_mixed_precision

    precision, _ = resolve_mixed_precision(FLAGS.mixed_precision)
    _, trainer = build_trainer(FLAGS.preset, precision, FLAGS.vocab_size, FLAGS.jit_compile)
    ids = tf.random.stateless_uniform([FLAGS.batch, FLAGS.length], [1, 2], 4, FLAGS.vocab_size,
                                      tf.int32)  # [B, T], no special ids
    batch = {"source": ids, "target_in": ids, "target_out": ids}
    iterator = batch_iterator(trainer.strategy,
                              lambda _: tf.data.Dataset.from_tensors(batch).repeat())
    for _ in range(FLAGS.warmup):
        trainer.train_step(iterator)["loss"].numpy()
    times = []
    for _ in range(FLAGS.steps):
        start = time.perf_counter()
        trainer.train_step(iterator)["loss"].numpy()
        times.append(time.perf_counter() - start)
    if FLAGS.profile_dir:
        tf.profiler.experimental.start(FLAGS.profile_dir)
        for _ in range(5):
            trainer.train_step(iterator)["loss"].numpy()
        tf.profiler.experimental.stop()
    median = statistics.median(times)
    print(json.dumps({"machine": cpu_description(), "preset": FLAGS.preset,
                      "precision": precision, "batch": [FLAGS.batch, FLAGS.length],
                      "median_ms": round(median * 1000), "min_ms": round(min(times) * 1000),
                      "tokens_per_s": round(FLAGS.batch * FLAGS.length / median)}))


if __name__ == "__main__":
    app.run(main)
