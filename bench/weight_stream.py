"""How fast a decoding step's weight products stream their weights: --products independent
[--rows, --width] x [--width, --columns] float32 products, each with its own weights (so that
every run reads them all from memory, as a search step reads its layers'), run through a
TensorFlow Session (TF Serving's route) with --session_threads, and in a child process with one
thread for everything (1:1; a process's first session sizes its thread pools, so each setting
gets its own process). Prints one JSON line: ms per run and GB/s of weights read for each, and
their ratio: what a second core adds when the products, not the graph's other ops, are the work.

At a search step's few rows a product reads its whole weight matrix for little arithmetic, so a
step of one sentence (beam 4: 4 rows) is bound by this rate (bench/README.md, "Decoding").

  python bench/weight_stream.py                        # 4 rows, 16 products of [256, 1024]
  python bench/weight_stream.py --session_threads=2:1  # one product at a time on both cores
  python bench/weight_stream.py --dtype=bfloat16       # half the bytes (AMX: not half the time)
"""
import json
import os
import subprocess
import sys
import time

from common import KERNELS, cpu_description, define_session_threads_flag, session_threads

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("rows", 4, "Rows of each product's input (beam 4, one sentence: 4).")
flags.DEFINE_integer("width", 256, "Input width (the model width D).")
flags.DEFINE_integer("columns", 1024, "Output width (the cpu preset's feed-forward size).")
flags.DEFINE_integer("products", 16, "Independent products per run, each its own weights.")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "The products' dtype (bfloat16: "
                  "input and weights rounded to it, as an export's bf16 products are).")
flags.DEFINE_integer("runs", 100, "Session runs per timing.")
flags.DEFINE_integer("windows", 5, "Timings per setting; the fastest is reported.")
flags.DEFINE_bool("baseline", True, "Also time 1:1 in a child process, and the ratio.")
define_session_threads_flag(default="1:2")


def main(_):
    import numpy as np
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    rng = np.random.default_rng(0)
    x_value = rng.normal(size=(FLAGS.rows, FLAGS.width)).astype(np.float32)
    dtype = tf.as_dtype(FLAGS.dtype)
    weight_bytes = FLAGS.products * FLAGS.width * FLAGS.columns * dtype.size

    def seconds_per_run(intra, inter):
        graph = tf.Graph()
        with graph.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [FLAGS.rows, FLAGS.width])
            kernels = [tf.Variable(tf.cast(rng.normal(0, 0.01, (FLAGS.width, FLAGS.columns))
                                           .astype(np.float32), dtype))
                       for _ in range(FLAGS.products)]
            x_cast = tf.cast(x, dtype)
            # One scalar per product, so that fetching the result costs nothing.
            total = tf.add_n([tf.reduce_sum(tf.cast(tf.matmul(x_cast, kernel), tf.float32))
                              for kernel in kernels])
            init = tf.compat.v1.global_variables_initializer()
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=intra,
                                          inter_op_parallelism_threads=inter)
        with tf.compat.v1.Session(graph=graph, config=config) as session:
            session.run(init)
            for _ in range(FLAGS.runs // 2):  # warm-up: kernels chosen, memory touched
                session.run(total, {x: x_value})
            timings = []
            for _ in range(FLAGS.windows):
                start = time.perf_counter()
                for _ in range(FLAGS.runs):
                    session.run(total, {x: x_value})
                timings.append((time.perf_counter() - start) / FLAGS.runs)
        return min(timings)

    given = seconds_per_run(*session_threads())
    result = {"machine": cpu_description(), "kernels": KERNELS,
              "products": f"{FLAGS.products} x [{FLAGS.rows}, {FLAGS.width}] x "
                          f"[{FLAGS.width}, {FLAGS.columns}] {FLAGS.dtype}",
              "weights_mb": round(weight_bytes / 1e6, 1),
              FLAGS.session_threads: {"ms": round(given * 1e3, 3),
                                      "gb_per_s": round(weight_bytes / given / 1e9, 1)}}
    if FLAGS.baseline:
        args = [FLAGS[name].serialize() for name in ("rows", "width", "columns", "products",
                                                     "dtype", "runs", "windows")]
        child = subprocess.run([sys.executable, os.path.abspath(__file__), "--nobaseline",
                                "--session_threads=1:1", *args],
                               capture_output=True, text=True, check=True)
        result["1:1"] = json.loads(child.stdout.strip().splitlines()[-1])["1:1"]
        result["speedup"] = round(result["1:1"]["ms"] / result[FLAGS.session_threads]["ms"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    app.run(main)
