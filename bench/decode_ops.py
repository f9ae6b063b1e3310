"""Where one request's time goes in an exported SavedModel: the ops a request executes, counted
and timed by type, through a TensorFlow Session (the route TF Serving's loader takes), from the
step statistics of a fully traced run.

Loads an export (`python export.py` first), translates --sentence --requests times untraced for
the wall time per request (the first of them, which prepares the graph, reported on its own;
with --warmup after the export's warmup requests, as TF Serving runs them at load), then once
traced. Op times are each op's own wall time summed over
every execution (two threads may overlap, so their sum can exceed the request's wall time).
The search's steps are the iterations of its longest loop (its `LoopCond` runs - 1).
Prints one JSON line: wall ms per request, executed ops, loop steps, the --top op types by
time with their counts, and the --top most executed op types per search step.

  python bench/decode_ops.py --export=runs/de-en/export/1
  TF_ENABLE_ONEDNN_OPTS=0 python bench/decode_ops.py --export=runs/de-en/export/1  # Eigen
"""
import collections
import json
import statistics
import time

from common import KERNELS, cpu_description, define_session_threads_flag, session_threads

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("export", "runs/de-en/export/1", "A SavedModel version directory.")
flags.DEFINE_string("sentence", "Und Jesus sprach zu ihnen: Folgt mir nach.",
                    "The source sentence of every request.")
flags.DEFINE_integer("batch", 1, "Copies of the sentence per request.")
flags.DEFINE_integer("requests", 40, "Untimed warm-up requests, then as many timed ones.")
define_session_threads_flag()
flags.DEFINE_integer("top", 20, "Op types listed, by their summed time and by their count.")
flags.DEFINE_bool("warmup", False, "Before the first request, run the export's warmup requests "
                  "(assets.extra/tf_serving_warmup_requests) as TF Serving does at load.")


def op_type(node_stats):
    # timeline_label reads "name = OpType(inputs)"
    label = node_stats.timeline_label
    return label.split(" = ", 1)[1].split("(", 1)[0] if " = " in label else node_stats.node_name


def main(_):
    if FLAGS.requests < 1 or FLAGS.batch < 1:
        raise app.UsageError("--requests and --batch must be at least 1")
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the export's tokenizer ops)

    from tfnmt.inference.saved_model import read_warmup_requests

    warmup_requests = read_warmup_requests(FLAGS.export) if FLAGS.warmup else []  # eagerly
    tf.compat.v1.disable_eager_execution()
    intra, inter = session_threads()
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=intra,
                                      inter_op_parallelism_threads=inter)
    with tf.compat.v1.Session(graph=tf.Graph(), config=config) as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], FLAGS.export)
        signature = meta.signature_def["serving_default"]
        feed = {signature.inputs["sentences"].name: [FLAGS.sentence] * FLAGS.batch}
        fetch = {name: output.name for name, output in signature.outputs.items()}
        warmup_seconds = None
        if FLAGS.warmup:
            start = time.perf_counter()
            for name, inputs in warmup_requests:
                warm = meta.signature_def[name]
                session.run({k: v.name for k, v in warm.outputs.items()},
                            {warm.inputs[k].name: v for k, v in inputs.items()})
            warmup_seconds = time.perf_counter() - start
        start = time.perf_counter()
        session.run(fetch, feed)
        first_seconds = time.perf_counter() - start
        for _ in range(FLAGS.requests - 1):
            session.run(fetch, feed)
        seconds = []
        for _ in range(FLAGS.requests):
            start = time.perf_counter()
            translation = session.run(fetch, feed)["translations"][0].decode()
            seconds.append(time.perf_counter() - start)
        metadata = tf.compat.v1.RunMetadata()
        session.run(fetch, feed, run_metadata=metadata, options=tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE))

    counts, micros = collections.Counter(), collections.Counter()
    loop_conditions = collections.Counter()  # a loop's LoopCond runs once per iteration + 1
    for device in metadata.step_stats.dev_stats:
        for node in device.node_stats:
            kind = op_type(node)
            counts[kind] += 1
            micros[kind] += node.all_end_rel_micros
            if kind == "LoopCond":
                loop_conditions[node.node_name] += 1
    steps = max(loop_conditions.values(), default=1) - 1  # the longest loop: the search
    top = sorted(counts, key=lambda kind: -micros[kind])[:FLAGS.top]
    print(json.dumps({
        "machine": cpu_description(), "kernels": KERNELS, "export": FLAGS.export,
        "batch": FLAGS.batch, "session_threads": FLAGS.session_threads,
        "translation": translation,
        "first_request_ms": round(first_seconds * 1e3, 2),
        "warmup_ms": None if warmup_seconds is None else round(warmup_seconds * 1e3, 2),
        "wall_ms_per_request": round(statistics.median(seconds) * 1e3, 2),
        "executed_ops": sum(counts.values()), "steps": steps,
        "ops_per_step": round(sum(counts.values()) / max(steps, 1)),
        "op_ms_total": round(sum(micros.values()) / 1e3, 2),
        "by_time": [{"op": kind, "count": counts[kind], "ms": round(micros[kind] / 1e3, 2)}
                    for kind in top],
        "per_step_by_count": {kind: round(count / max(steps, 1), 1)
                              for kind, count in counts.most_common(FLAGS.top)}}))


if __name__ == "__main__":
    app.run(main)
