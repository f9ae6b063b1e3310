"""Requests to exported SavedModels, side by side: each export loaded through a TensorFlow
Session (the route TF Serving's loader takes) in this one process, then the first --sentences
test sentences sent --batch per request to each export in turn, --rounds times, so that the
machine's drift between hours falls on all of them alike. Prints one JSON line: per export,
the median and total milliseconds of its requests and its sentences/s, and whether every
export gave the same translations. For before/after comparisons of the search (export the same
model with each version of the code). Each session keeps its own thread pools, whose idle
threads slow the other sessions' requests: compare the ratio, not the sentences/s of a server.

  python bench/latency.py --exports=runs/a/export/1,runs/b/export/1
  python bench/latency.py --exports=... --batch=32 --sentences=512 --session_threads=1:2
"""
import json
import statistics
import time

from common import KERNELS, cpu_description, define_session_threads_flag, session_threads

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_list("exports", None, "SavedModel version directories, compared side by side.")
flags.DEFINE_string("source", None, "Sentences, one per line (default: the embedded test "
                    "split's German side).")
flags.DEFINE_integer("sentences", 40, "How many of them.")
flags.DEFINE_integer("batch", 1, "Sentences per request.")
flags.DEFINE_integer("rounds", 3, "Passes over the sentences (the first also warms up).")
define_session_threads_flag()
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
    if FLAGS.sentences < 1 or FLAGS.rounds < 1 or FLAGS.batch < 1:
        raise app.UsageError("--sentences, --rounds and --batch must be at least 1")
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the exports' tokenizer ops)

    texts = sentences()
    requests = [texts[i:i + FLAGS.batch] for i in range(0, len(texts), FLAGS.batch)]
    tf.compat.v1.disable_eager_execution()
    intra, inter = session_threads()
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=intra,
                                      inter_op_parallelism_threads=inter)
    served = []
    for path in FLAGS.exports:
        graph = tf.Graph()
        session = tf.compat.v1.Session(graph=graph, config=config)
        with graph.as_default():
            meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
        signature = meta.signature_def["serving_default"]
        served.append((session, signature.inputs["sentences"].name,
                       {name: output.name for name, output in signature.outputs.items()}))
    for session, feed, fetch in served:  # each signature's first run prepares its graph
        session.run(fetch, {feed: requests[0]})
    seconds = [[] for _ in served]
    translations = [[] for _ in served]
    for round_index in range(FLAGS.rounds):
        for request in requests:
            for index, (session, feed, fetch) in enumerate(served):
                start = time.perf_counter()
                out = session.run(fetch, {feed: request})
                seconds[index].append(time.perf_counter() - start)
                if round_index == 0:
                    translations[index].extend(t.decode() for t in out["translations"])
    print(json.dumps({
        "machine": cpu_description(), "kernels": KERNELS, "sentences": len(texts),
        "batch": FLAGS.batch, "session_threads": FLAGS.session_threads, "rounds": FLAGS.rounds,
        "exports": [{"export": path, "median_ms": round(statistics.median(s) * 1e3, 2),
                     "total_ms": round(sum(s) * 1e3, 1),
                     "sentences_per_s": round(len(texts) * FLAGS.rounds / sum(s), 2)}
                    for path, s in zip(FLAGS.exports, seconds)],
        "same_translations": all(t == translations[0] for t in translations)}))


if __name__ == "__main__":
    app.run(main)
