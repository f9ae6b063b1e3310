"""Input pipeline speed and padding: examples/s and batches/s of
tfnmt.data.pipeline.make_dataset over the prepared embedded corpus (one epoch after a warm-up),
the share of padded positions and the number of distinct batch shapes, with and without
shape-stable (bucket-edge) padding, for one bucket per length (--bucket_growth=1.0) and 10%-wide
buckets (1.1, the default); and the share of a training step's matmul FLOPs that padded
positions take (--preset's model), which bounds what packing pairs into rows without padding
could speed up. Prints one JSON line.

  python bench/pipeline.py
  python bench/pipeline.py --preset=cpu --batch_tokens=1024   # the main job's batches
"""
import json
import time

from common import cpu_description, forward_flops, padded_forward_flops, prepared_data

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", "runs/bench-data", "Prepared embedded corpus (made if missing).")
flags.DEFINE_integer("batch_tokens", 4096, "Token budget per batch.")
flags.DEFINE_string("preset", "small", "The model whose FLOPs on padding are counted.")


def main(argv):
    del argv
    import tensorflow as tf

    from tfnmt.data import pipeline
    from tfnmt.data.special_tokens import PAD_ID
    from tfnmt.model.presets import get_preset
    from tfnmt.model.transformer import Transformer

    manifest = prepared_data(FLAGS.data_dir)
    settings = Transformer(vocab_size=manifest["settings"]["vocab_size"],
                           **get_preset(FLAGS.preset)).settings
    result = {"machine": cpu_description(), "batch_tokens": FLAGS.batch_tokens,
              "preset": FLAGS.preset}
    for growth in (1.0, 1.1):
        for shape_stable in (False, True):
            def epoch():
                return pipeline.make_dataset(FLAGS.data_dir, "train", FLAGS.batch_tokens, seed=0,
                                             shape_stable=shape_stable, bucket_growth=growth)

            for _ in epoch().take(20):  # warm-up: file handles, autotuning
                pass
            examples = batches = 0
            shapes = set()
            start = time.perf_counter()
            for batch in epoch():
                examples += int(tf.shape(batch["source"])[0])
                batches += 1
                shapes.add((tuple(batch["source"].shape), tuple(batch["target_in"].shape)))
            elapsed = time.perf_counter() - start
            fraction, _ = pipeline.padding_fraction(epoch())
            real_flops = padded_flops = 0
            for batch in epoch():
                sources, targets = (tf.reduce_sum(tf.cast(batch[side] != PAD_ID, tf.int64),
                                                  1).numpy().tolist()
                                    for side in ("source", "target_in"))
                real_flops += forward_flops(sources, targets, settings)
                padded_flops += padded_forward_flops(batch["source"].shape[1],
                                                     batch["target_in"].shape[1], targets,
                                                     settings)
            key = f"growth_{growth}_" + ("shape_stable" if shape_stable else "pad_to_longest")
            result[key] = {"examples_per_s": round(examples / elapsed),
                           "batches_per_s": round(batches / elapsed, 1), "batches": batches,
                           "batch_shapes": len(shapes), "padding_fraction": round(fraction, 4),
                           # The step's matmul work on padded positions, and the speed-up
                           # a step doing none would reach at equal efficiency.
                           "padded_flops_share": round(1 - real_flops / padded_flops, 4),
                           "no_padding_bound": round(padded_flops / real_flops, 3)}
    print(json.dumps(result))


if __name__ == "__main__":
    app.run(main)
