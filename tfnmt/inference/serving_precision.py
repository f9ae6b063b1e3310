"""Which dtype an `auto` SavedModel's weight products run in, decided on the machine that serves.

Such an export holds a float32 and a bfloat16 search (`TranslationModule(matmul_dtype="auto")`).
Native bfloat16 is not always the faster one: with the same CPU flags (AVX512-BF16, no AMX) the
bf16 search decoded 0.75x as fast as float32 on an Intel Xeon and 1.2x as fast on an AMD Zen 5
EPYC (bench/README.md). So the graph decides by timing, as `train.py --mixed_precision=auto`
does: where the serving CPU has native bfloat16 (its Linux CPU flags, read in the graph), the
first request of a process times products of the model's own output weights in both dtypes
(`bf16_speedup`) and keeps bfloat16 if it is at least `min_speedup` times faster. The choice is
kept in a variable, so later requests of the process only read it. Without native bfloat16
(emulated: many times slower) no timing runs and the search is float32; the same where the
serving process caps oneDNN below the bfloat16 instructions (`ONEDNN_MAX_CPU_ISA=AVX2`, as
bench/README.md suggests to reproduce an AVX2 CPU), under which a bfloat16 product aborts it.
"""
import tensorflow as tf

from tfnmt.cpu_kernels import BF16_ISA_WORDS
from tfnmt.training.precision import BF16_MIN_SPEEDUP, NATIVE_BF16_FLAGS, fastest_interleaved

CPUINFO = "/proc/cpuinfo"  # read by the graph, on the serving machine
ENVIRON = "/proc/self/environ"  # the serving process' environment: NAME=value, NUL-separated


def _file_matches(path, pattern):
    """In the graph: whether the file at `path` exists and all of it matches `pattern` (RE2)."""
    present = tf.size(tf.io.matching_files(path)) > 0
    return tf.cond(present,
                   lambda: tf.strings.regex_full_match(tf.io.read_file(path), pattern),
                   lambda: tf.constant(False))


def has_native_bf16(cpuinfo=CPUINFO, environ=ENVIRON):
    """In the graph: whether the process that runs it may search in bfloat16: its CPU computes
    bfloat16 natively (one of NATIVE_BF16_FLAGS among its Linux CPU flags; False where the file
    is missing), and its environment leaves oneDNN's bfloat16 instructions on
    (ONEDNN_MAX_CPU_ISA unset or naming a bfloat16 ISA, as `precision.cpu_has_bf16` decides
    for training). A Python-side check would see the exporting machine, not the serving one.
    TensorFlow's graph optimizer folds the reads into a constant when a process first runs the
    graph.

    Args:
      cpuinfo: the CPU description to read (tests give their own).
      environ: the environment to read (tests give their own).

    Returns:
      A bool scalar tensor.
    """
    flags = r"(?s).*\b(" + "|".join(NATIVE_BF16_FLAGS) + r")\b.*"
    # A variable is at the file's start or after a NUL; its value runs to the next NUL.
    variable = r"(.*\x00)?ONEDNN_MAX_CPU_ISA=[^\x00]*"
    capped = _file_matches(environ, r"(?s)" + variable + r"[^\x00](\x00.*)?")  # not empty
    cap_has_bf16 = _file_matches(environ, r"(?s)" + variable + "(?i:" + "|".join(BF16_ISA_WORDS)
                                 + r")[^\x00]*(\x00.*)?")
    return tf.logical_and(_file_matches(cpuinfo, flags),
                          tf.logical_or(tf.logical_not(capped), cap_has_bf16))


def bf16_speedup(weights, rows=64, repeats=4, windows=5):
    """In the graph: how many times faster this CPU multiplies [rows, D] x [D, V] in bfloat16
    than in float32, with `weights` [V, D] (the output layer: a search step's largest product,
    at its row count). Each dtype runs `windows` timed groups of `repeats` products on fresh
    random inputs (never folded or merged by the graph optimizer), the two dtypes' groups in
    turn after an untimed group of each (`precision.fastest_interleaved`); the fastest group
    of each counts, so neither kernel set-up nor a burst of load from elsewhere does.

    Args:
      weights: [V, D] float32.
      rows, repeats, windows: the timed products.

    Returns:
      A float64 scalar tensor: float32 seconds / bfloat16 seconds.
    """
    depth = tf.shape(weights)[1]
    dtypes = (tf.float32, tf.bfloat16)
    kernels = {dtype: tf.cast(weights, dtype) for dtype in dtypes}
    # [windows + 1, repeats, rows, D] per dtype: the untimed group's inputs, then the timed ones.
    inputs = {dtype: tf.cast(tf.random.uniform([windows + 1, repeats, rows, depth]), dtype)
              for dtype in dtypes}
    groups = {dtype: 0 for dtype in dtypes}
    previous = [*kernels.values(), *inputs.values()]

    def time_group(dtype):
        group, groups[dtype] = groups[dtype], groups[dtype] + 1
        with tf.control_dependencies(previous):
            start = tf.timestamp()
        with tf.control_dependencies([start]):
            done = tf.add_n([tf.matmul(inputs[dtype][group, i], kernels[dtype],
                                       transpose_b=True)[0, 0] for i in range(repeats)])
        with tf.control_dependencies([done]):
            end = tf.timestamp()
        previous[:] = [end]
        # The seconds depend on the products' data too: the graph optimizer prunes
        # computations reached only by control edges, and the group would time nothing.
        return tf.where(tf.math.is_nan(tf.cast(done, tf.float32)),
                        tf.constant(float("inf"), tf.float64), end - start)

    fastest = fastest_interleaved(time_group, dtypes, windows, minimum=tf.minimum)
    return fastest[tf.float32] / tf.maximum(fastest[tf.bfloat16], 1e-9)


class SearchPrecision(tf.Module):
    """The per-process choice between a bfloat16 and a float32 search (module docstring).

    Args:
      weights: the model's output weights [V, D] float32, timed by the first request.
      cpuinfo: the file the CPU flags are read from (tests give their own).
      min_speedup: bfloat16 is chosen where its products run at least this many times faster
        than float32's (training's threshold by default).
      environ: the file the process environment is read from (tests give their own).

    Example (in a tf.function):
      use_bf16 = precision.prefers_bf16()  # bool scalar
    """

    def __init__(self, weights, cpuinfo=CPUINFO, min_speedup=BF16_MIN_SPEEDUP, environ=ENVIRON):
        super().__init__(name="search_precision")
        self.weights, self.min_speedup = weights, float(min_speedup)
        self.cpuinfo, self.environ = cpuinfo, environ
        # -1: not decided yet in this process; 0: float32; 1: bfloat16.
        self.choice = tf.Variable(-1, dtype=tf.int32, trainable=False, name="bf16_search")

    def prefers_bf16(self):
        """In the graph: whether this process searches with bfloat16 products; decided (and
        kept) by the first call.

        Returns:
          A bool scalar tensor.
        """
        def decide():
            faster = tf.cond(
                has_native_bf16(self.cpuinfo, self.environ),
                lambda: bf16_speedup(tf.convert_to_tensor(self.weights)) >= self.min_speedup,
                lambda: tf.constant(False))
            value = tf.cast(faster, tf.int32)
            with tf.control_dependencies([self.choice.assign(value)]):
                return tf.identity(value)

        decided = tf.cond(self.choice < 0, decide, lambda: tf.identity(self.choice))
        return decided > 0
