"""One-sentence requests to exported SavedModels, side by side: each export loaded through a
TensorFlow Session (the route TF Serving's loader takes) in this one process, then the first
--sentences test sentences sent one per request to each export in turn, --rounds times, so that
the machine's drift between hours falls on all of them alike. Prints one JSON line: per
export, the median and total milliseconds of its requests, and whether every export gave the
same translations. For before/after comparisons of the search (export the same model with
each version of the code).

  python bench/latency.py --exports=runs/a/export/1,runs/b/export/1
"""
import json
import statistics
import time

from common import KERNELS, cpu_description

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_list("exports", None, "SavedModel version directories, compared side by side.")
flags.DEFINE_string("source", None, "Sentences, one per line (default: the embedded test "
                    "split's German side).")
flags.DEFINE_integer("sentences", 40, "How many of them.")
flags.DEFINE_integer("rounds", 3, "Passes over the sentences (the first also warms up).")
flags.mark_flag_as_required("exports")


def sentences():
    if FLAGS.source:
        with open(FLAGS.source, encoding="utf-8") as f:
            lines = f.read().splitlines()
    else:
        import itertools

        from tfnmt.data.corpus import read_corpus

        lines = [source for source, _ in itertools.islice(
            read_corpus("embedded", "test", log_skipped=False), FLAGS.sentences)]
    return lines[:FLAGS.sentences]


def main(_):
    if FLAGS.sentences < 1 or FLAGS.rounds < 1:
        raise app.UsageError("--sentences and --rounds must be at least 1")
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the exports' tokenizer ops)

    texts = sentences()
    tf.compat.v1.disable_eager_execution()
    served = []
    for path in FLAGS.exports:
        graph = tf.Graph()
        session = tf.compat.v1.Session(graph=graph)
        with graph.as_default():
            meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
        signature = meta.signature_def["serving_default"]
        served.append((session, signature.inputs["sentences"].name,
                       {name: output.name for name, output in signature.outputs.items()}))
    for session, feed, fetch in served:  # each signature's first run prepares its graph
        session.run(fetch, {feed: texts[:1]})
    seconds = [[] for _ in served]
    translations = [[] for _ in served]
    for round_index in range(FLAGS.rounds):
        for text in texts:
            for index, (session, feed, fetch) in enumerate(served):
                start = time.perf_counter()
                out = session.run(fetch, {feed: [text]})
                seconds[index].append(time.perf_counter() - start)
                if round_index == 0:
                    translations[index].append(out["translations"][0].decode())
    print(json.dumps({
        "machine": cpu_description(), "kernels": KERNELS, "sentences": len(texts),
        "rounds": FLAGS.rounds,
        "exports": [{"export": path, "median_ms": round(statistics.median(s) * 1e3, 2),
                     "total_ms": round(sum(s) * 1e3, 1)}
                    for path, s in zip(FLAGS.exports, seconds)],
        "same_translations": all(t == translations[0] for t in translations)}))


if __name__ == "__main__":
    app.run(main)
