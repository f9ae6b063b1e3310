"""LayerNorm's inference form against tf.nn.moments + tf.nn.batch_normalization, in a search-like
loop: a tf.while_loop of --layers LayerNorms of --rows x --width float32 rows (each with its own
γ and β variables, and a residual sum between them, as in a decoding step), run through a
TensorFlow Session (TF Serving's route) with --session_threads. Prints one JSON line: µs per
LayerNorm of each form (the loop's own cost, measured without LayerNorms, taken off), median of
--windows timings.

  python bench/layer_norm.py --rows=64
  TF_ENABLE_ONEDNN_OPTS=0 ONEDNN_MAX_CPU_ISA=AVX2 python bench/layer_norm.py --rows=64  # Eigen
"""
import json
import statistics
import time

from common import KERNELS, cpu_description, define_session_threads_flag, session_threads

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("rows", 64, "Rows per LayerNorm (a search step's hypotheses).")
flags.DEFINE_integer("width", 256, "The model width D.")
flags.DEFINE_integer("layers", 7, "LayerNorms per loop iteration (the cpu preset's step: 7).")
flags.DEFINE_integer("iterations", 500, "Loop iterations per timing.")
flags.DEFINE_integer("windows", 3, "Timings per form.")
define_session_threads_flag()


def main(_):
    import numpy as np
    import tensorflow as tf

    from tfnmt.layers import LayerNorm

    tf.compat.v1.disable_eager_execution()
    intra, inter = session_threads()
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=intra,
                                      inter_op_parallelism_threads=inter)
    rng = np.random.default_rng(0)
    x_value = rng.normal(1.0, 3.0, (FLAGS.rows, FLAGS.width)).astype(np.float32)

    def batch_normalization(norm, x):  # the form tfnmt's LayerNorm replaced
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        return tf.nn.batch_normalization(x, mean, variance, tf.convert_to_tensor(norm.beta),
                                         tf.convert_to_tensor(norm.gamma), norm.epsilon)

    forms = {"layer_norm": lambda norm, x: norm(x),
             "batch_normalization": batch_normalization,
             "none": lambda norm, x: x}

    def seconds(form):
        graph = tf.Graph()
        with graph.as_default():
            norms = [LayerNorm() for _ in range(FLAGS.layers)]
            for norm in norms:
                norm.build((None, FLAGS.width))
            x0 = tf.compat.v1.placeholder(tf.float32, [None, FLAGS.width])

            @tf.function
            def loop(x0):
                def body(i, x):
                    for norm in norms:
                        x = x + 0.5 * forms[form](norm, x)  # [R, D]
                    return i + 1, x
                return tf.while_loop(lambda i, x: i < FLAGS.iterations, body,
                                     (tf.constant(0), x0))[1]

            out = loop(x0)
            init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session(graph=graph, config=config) as session:
            session.run(init)
            session.run(out, {x0: x_value})
            times = []
            for _ in range(FLAGS.windows):
                start = time.perf_counter()
                session.run(out, {x0: x_value})
                times.append(time.perf_counter() - start)
        return statistics.median(times) / (FLAGS.iterations * FLAGS.layers)

    loop_only = seconds("none")
    result = {name: round((seconds(name) - loop_only) * 1e6, 2)
              for name in ("layer_norm", "batch_normalization")}
    print(json.dumps({"machine": cpu_description(), "kernels": KERNELS, "rows": FLAGS.rows,
                      "width": FLAGS.width, "session_threads": FLAGS.session_threads,
                      "us_per_layer_norm": result}))


if __name__ == "__main__":
    app.run(main)
