"""Training speed against this machine's matmul ceiling, in one run.

Prints, as one JSON line: the fp32 and bf16 matmul ceilings measured in this process (bf16
where oneDNN may run it natively or --mixed_precision=bf16 asks for it, else null), then target
tokens/s and model-FLOP utilisation of the real training step (tfnmt.training.trainer.Trainer
over the real tf.data pipeline on the embedded corpus) as the median of several windows after
warm-up, plus the RSS after each window and the peak RSS.

  python bench/train.py                                   # small preset, bf16 where native
  python bench/train.py --preset=base --steps=60 --window=10
  python bench/train.py --mixed_precision=none --shape_stable=false   # a before/after pair

Model FLOPs count the matmuls of forward + backward (3x forward) on the *real* (unpadded)
tokens of each batch (bench/common.py:forward_flops); utilisation divides them by the bf16
(or fp32 for --mixed_precision=none) ceiling, and also by the rate of the model's own
feed-forward GEMM shape (`model_gemm_gflops`), the best its matmuls could do here.

`gemm_only_bound` answers "how far could utilisation go here at all?": every matrix product of
the first --bound_batches timed batches (forward and gradients, at their padded shapes;
bench/common.py:training_gemms) timed alone in the step's dtype, summed, and the model FLOPs of
those batches divided by that time and by the ceiling: the utilisation of a step whose
non-matmul work (softmax, dropout, LayerNorm, casts, optimizer, input) took no time at all.
"""
import json
import statistics
import time

import common
from common import (KERNELS, MALLOC, build_trainer, cpu_description, define_trainer_flags,
                    forward_flops, matmul_ceiling, matmul_seconds, peak_rss_bytes, prepared_data,
                    rss_bytes, training_gemms)

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
define_trainer_flags()
flags.adopt_module_key_flags(common)  # listed by --help with the flags below
flags.DEFINE_string("data_dir", "runs/bench-data", "Prepared embedded corpus (made if missing).")
flags.DEFINE_integer("batch_tokens", 4096, "Token budget per batch, as train.py.")
flags.DEFINE_integer("steps", 200, "Timed steps after warm-up.", lower_bound=1)
flags.DEFINE_integer("warmup", 40, "Untimed steps first (tracing, per-shape kernels).",
                     lower_bound=0)
flags.DEFINE_integer("window", 20, "Steps per timing window; the median window is reported.",
                     lower_bound=1)
flags.DEFINE_bool("shape_stable", True, "Pad batches to their bucket boundary (train.py's "
                  "--shape_stable).")
flags.DEFINE_float("bucket_growth", 1.1, "Length bucket growth (train.py's --bucket_growth).")
flags.DEFINE_bool("ceiling", True, "Measure the matmul ceilings first.")
flags.DEFINE_integer("bound_batches", 8, "With --ceiling, time the matmuls of this many of the "
                     "timed batches alone for `gemm_only_bound` (0: skip).", lower_bound=0)
flags.DEFINE_string("profile_dir", None, "Also write a tf.profiler trace of 5 steps after the "
                    "timed ones here (open with TensorBoard's Profile tab).")


def main(argv):
    del argv
    import tensorflow as tf

    from tfnmt.data import pipeline
    from tfnmt.data.special_tokens import PAD_ID
    from tfnmt.training.distribute import batch_iterator
    from tfnmt.training.precision import cpu_has_bf16, resolve_mixed_precision

    result = {"machine": cpu_description(), "malloc": MALLOC, "kernels": KERNELS,
              "tensorflow": tf.__version__,
              "preset": FLAGS.preset, "batch_tokens": FLAGS.batch_tokens,
              "shape_stable": FLAGS.shape_stable, "bucket_growth": FLAGS.bucket_growth,
              "jit_compile": FLAGS.jit_compile}
    if FLAGS.ceiling:
        # bf16 only where oneDNN may run it: under an ISA cap below bf16 (ONEDNN_MAX_CPU_ISA=AVX2
        # on a bf16 CPU) a bf16 matmul aborts the process instead of raising.
        result["ceiling_gflops"] = {
            "fp32": round(matmul_ceiling(tf.float32), 1),
            "bf16": (round(matmul_ceiling(tf.bfloat16), 1)
                     if cpu_has_bf16() or FLAGS.mixed_precision == "bf16" else None)}
    manifest = prepared_data(FLAGS.data_dir)
    precision, reason = resolve_mixed_precision(FLAGS.mixed_precision)
    result["precision"] = precision
    if reason:
        result["precision_chosen"] = reason
    model, trainer = build_trainer(FLAGS.preset, precision,
                                   manifest["settings"]["vocab_size"], FLAGS.jit_compile)
    settings = model.settings
    if FLAGS.ceiling:
        # The model's own GEMMs at a 4,096-row batch: the feed-forward [N, d] x [d, d_ff] and
        # the tied softmax [N, d] x [d, V], in the training compute dtype.
        dtype = tf.float32 if precision == "none" else tf.bfloat16
        d, d_ff, vocab = settings["d_model"], settings["d_ff"], settings["target_vocab_size"]
        result["model_gemm_gflops"] = {
            "ffn": round(matmul_ceiling(dtype, (4096, d, d_ff)), 1),
            "softmax": round(matmul_ceiling(dtype, (4096, d, vocab), repeats=2), 1)}

    def dataset():
        return pipeline.make_dataset(FLAGS.data_dir, "train", FLAGS.batch_tokens, shuffle=True,
                                     seed=7, repeat=True, shape_stable=FLAGS.shape_stable,
                                     bucket_growth=FLAGS.bucket_growth)

    total_steps = FLAGS.warmup + FLAGS.steps
    # The same deterministic batches, read once in Python to count their real lengths.
    step_flops, step_shapes = [], []
    for batch in dataset().take(total_steps):
        source_lengths = tf.reduce_sum(tf.cast(batch["source"] != PAD_ID, tf.int64), 1)
        target_lengths = tf.reduce_sum(tf.cast(batch["target_in"] != PAD_ID, tf.int64), 1)
        step_flops.append(3 * forward_flops(source_lengths.numpy(), target_lengths.numpy(),
                                            settings))
        step_shapes.append((*batch["source"].shape, batch["target_in"].shape[1]))  # B, S, T
    iterator = batch_iterator(trainer.strategy, lambda _: dataset())  # as train.py reads

    start = time.perf_counter()
    for _ in range(FLAGS.warmup):
        trainer.train_step(iterator)["loss"].numpy()
    result["warmup_seconds"] = round(time.perf_counter() - start, 1)
    windows, rss = [], []
    step = FLAGS.warmup
    while step < total_steps:
        count = min(FLAGS.window, total_steps - step)
        tokens = 0.0
        start = time.perf_counter()
        for _ in range(count):
            tokens += float(trainer.train_step(iterator)["target_tokens"])
        elapsed = time.perf_counter() - start
        flops = sum(step_flops[step:step + count])
        windows.append((tokens / elapsed, flops / elapsed / 1e9, elapsed / count))
        rss.append(round(rss_bytes() / 2 ** 30, 2))
        step += count
    if FLAGS.profile_dir:
        tf.profiler.experimental.start(FLAGS.profile_dir)
        for _ in range(5):
            trainer.train_step(iterator)["loss"].numpy()
        tf.profiler.experimental.stop()
    tokens_per_s = statistics.median(w[0] for w in windows)
    gflops = statistics.median(w[1] for w in windows)
    ceiling_key = "fp32" if precision == "none" else "bf16"
    result.update({
        "target_tokens_per_s": round(tokens_per_s),
        "window_tokens_per_s": [round(w[0]) for w in windows],
        "model_gflops_per_s": round(gflops, 1),
        "model_gflop_per_step": round(statistics.mean(step_flops) / 1e9, 2),
        "seconds_per_step": round(statistics.median(w[2] for w in windows), 4),
        "rss_gib_per_window": rss,
        "peak_rss_gib": round(peak_rss_bytes() / 2 ** 30, 2)})
    if FLAGS.ceiling and FLAGS.bound_batches:
        result.update(gemm_only_bound(step_shapes, step_flops, settings, dtype,
                                      result["ceiling_gflops"][ceiling_key]))
    if FLAGS.ceiling:
        result["utilisation_of_ceiling"] = round(gflops / result["ceiling_gflops"][ceiling_key], 3)
        result["utilisation_ceiling"] = ceiling_key
        result["utilisation_of_ffn_gemm"] = round(gflops / result["model_gemm_gflops"]["ffn"], 3)
    print(json.dumps(result))


def gemm_only_bound(step_shapes, step_flops, settings, dtype, ceiling_gflops):
    """The utilisation a step would reach if its matrix products were all it did (see the
    module docstring), over the first --bound_batches timed batches."""
    first = FLAGS.warmup
    batches = range(first, min(first + FLAGS.bound_batches, len(step_shapes)))
    seconds_of = {}  # per distinct product shape
    gemm_seconds = 0.0
    for step in batches:
        for key, count in training_gemms(settings, *step_shapes[step]).items():
            if key not in seconds_of:
                seconds_of[key] = matmul_seconds(*key, dtype)
            gemm_seconds += count * seconds_of[key]
    flops = sum(step_flops[step] for step in batches)
    return {"gemm_seconds_per_step": round(gemm_seconds / len(batches), 4),
            "gemm_only_bound": round(flops / gemm_seconds / 1e9 / ceiling_gflops, 3)}


if __name__ == "__main__":
    app.run(main)
