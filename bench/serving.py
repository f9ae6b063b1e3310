"""What one TF Serving request costs, and whether batching changes answers, measured through
TensorFlow's C++ loader (the route TF Serving takes: tfnmt/inference/session_loader.py).

1. Batch invariance: the first --sentences test sentences, each translated alone and in random
   batches of --batch_size (as TF Serving's batching would mix them): how many translations
   differ, and the largest score difference, per --matmul_dtypes export.
2. Resources per call: requests of long sentences (test sentences joined until they reach the
   model's max_length - 1 subwords, the longest a source can be) with --counts sentences each,
   for an export with --chunk_size and, for comparison, one with no chunking (chunk_size =
   the largest count). Each call runs in a fresh process that has loaded the export and
   translated one sentence: its wall time and its peak RSS above the RSS before the call.
Prints one JSON line.

  python bench/serving.py                         # after `python train.py` (runs/de-en)
  python bench/serving.py --counts=64,1024 --matmul_dtypes=float32
"""
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

from common import ROOT, cpu_description, rss_bytes
from tfnmt import paths  # noqa: E402

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", "runs/de-en", "Training directory to export and measure.")
flags.DEFINE_integer("sentences", 300, "Test sentences compared alone and in batches.")
flags.DEFINE_integer("batch_size", 64, "Sentences per batch in the batch-invariance check.")
flags.DEFINE_list("matmul_dtypes", ["float32", "bfloat16"], "Exports checked for batch "
                  "invariance (bfloat16 is slow where bf16 is not native).")
flags.DEFINE_integer("chunk_size", 64, "export.py --chunk_size of the export measured.")
flags.DEFINE_list("counts", ["64", "256", "1024"], "Long sentences per measured call (none: "
                  "skip the resource measurements).")
flags.DEFINE_bool("unchunked", True, "Also measure an export without chunks (chunk_size = the "
                  "largest count), for comparison. Default true.")
flags.DEFINE_string("call", None, "Internal: measure one call of this export (a child process).")
flags.DEFINE_string("call_input", None, "Internal: JSON file of the call's sentences.")


def export(export_dir, matmul_dtype, chunk_size):
    subprocess.run([sys.executable, os.path.join(ROOT, "export.py"),
                    f"--model_dir={FLAGS.model_dir}", f"--export_dir={export_dir}",
                    f"--matmul_dtype={matmul_dtype}", f"--chunk_size={chunk_size}", "--n_best=1"],
                   check=True, stdout=subprocess.DEVNULL)
    return os.path.join(export_dir, "1")


def measure_call(path, input_path):
    """Child process: load, warm up on one sentence, then time one call of the sentences."""
    import numpy as np
    import tensorflow_text  # noqa: F401

    from tfnmt.inference.session_loader import SessionModel

    with open(input_path) as f:
        sentences = np.array([s.encode() for s in json.load(f)], object)
    served = SessionModel(path)
    served.run("serving_default", {"sentences": sentences[:1]})
    before = rss_bytes()
    start = time.perf_counter()
    out = served.run("serving_default", {"sentences": sentences})
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"sentences": len(sentences), "seconds": round(seconds, 1),
                      "rss_before_gib": round(before / 2 ** 30, 2),
                      "peak_above_before_gib": round(max(peak - before, 0) / 2 ** 30, 2),
                      "answered": int(out["translations"].shape[0])}))


def long_sentences(sources, tokenizer, pieces, count):
    """`count` sentences of at least `pieces` subwords, each test sentences joined from its
    own starting point."""
    lengths = tokenizer.tokenize(sources).row_lengths().numpy()
    result = []
    for start in range(count):
        index, total, parts = start % len(sources), 0, []
        while total < pieces:
            parts.append(sources[index])
            total += int(lengths[index]) + 1
            index = (index + 1) % len(sources)
        result.append(" ".join(parts))
    return result


def batch_invariance(path, sources, batch_size):
    import numpy as np

    from tfnmt.inference.session_loader import SessionModel

    served = SessionModel(path)

    def translate(batch):
        out = served.run("serving_default", {"sentences": np.array(
            [s.encode() for s in batch], object)})
        return out["translations"].tolist(), out["scores"].tolist()

    alone = [translate([s]) for s in sources]
    order = np.random.default_rng(0).permutation(len(sources))
    differ, largest = 0, 0.0
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        translations, scores = translate([sources[i] for i in batch])
        for row, i in enumerate(batch):
            differ += translations[row] != alone[i][0][0]
            if translations[row] == alone[i][0][0]:
                largest = max(largest, abs(scores[row] - alone[i][1][0]))
    served.close()
    return {"sentences": len(sources), "translations_differ": int(differ),
            "largest_score_difference_of_equal_translations": largest}


def main(argv):
    del argv
    if FLAGS.call:
        return measure_call(FLAGS.call, FLAGS.call_input)
    import tensorflow as tf  # noqa: F401
    import tensorflow_text  # noqa: F401

    from tfnmt.data.corpus import read_split
    from tfnmt.data.tokenizer import Tokenizer

    with open(os.path.join(FLAGS.model_dir, paths.SETTINGS)) as f:
        settings = json.load(f)
    data = settings["data"]
    sources = [s for s, _ in read_split(data, "test")]
    scratch = tempfile.mkdtemp(prefix="tfnmt-bench-serving-")
    result = {"machine": cpu_description(), "model_dir": FLAGS.model_dir,
              "chunk_size": FLAGS.chunk_size}
    for matmul_dtype in FLAGS.matmul_dtypes:
        path = export(os.path.join(scratch, f"invariance-{matmul_dtype}"), matmul_dtype,
                      FLAGS.chunk_size)
        result[f"batch_invariance_{matmul_dtype}"] = batch_invariance(
            path, sources[:FLAGS.sentences], FLAGS.batch_size)

    counts = sorted(int(c) for c in FLAGS.counts)
    if not counts:
        print(json.dumps(result))
        return
    tokenizer = Tokenizer(os.path.join(FLAGS.model_dir, paths.VOCAB))
    pieces = settings["model"]["max_length"] - 1
    input_path = os.path.join(scratch, "long.json")
    with open(input_path, "w") as f:
        json.dump(long_sentences(sources, tokenizer, pieces, counts[-1]), f)
    exports = {f"chunk_size_{FLAGS.chunk_size}": FLAGS.chunk_size}
    if FLAGS.unchunked and counts[-1] > FLAGS.chunk_size:
        exports["unchunked"] = counts[-1]
    result["long_sentence_subwords"] = pieces
    for name, chunk_size in exports.items():
        path = export(os.path.join(scratch, name), "float32", chunk_size)
        for count in counts:
            subset = os.path.join(scratch, f"long-{count}.json")
            with open(input_path) as f, open(subset, "w") as g:
                json.dump(json.load(f)[:count], g)
            child = subprocess.run([sys.executable, os.path.abspath(__file__), f"--call={path}",
                                    f"--call_input={subset}"], capture_output=True, text=True,
                                   check=True)
            result[f"{name}_call_{count}"] = json.loads(child.stdout.strip().splitlines()[-1])
    print(json.dumps(result))


if __name__ == "__main__":
    app.run(main)
