"""Helpers shared by the benchmarks: the matmul ceiling, model FLOPs, RSS, prepared data."""
import os
import resource
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from tfnmt.summaries import rss_bytes  # noqa: E402,F401  (re-exported for the benchmarks)


def matmul_ceiling(dtype, shape=(2048, 2048, 2048), repeats=8, windows=5):
    """Sustained GFLOP/s of [m, k] x [k, n] matmuls in `dtype` (median over `windows` timings of
    `repeats` independent products per call), on this process' threads. The default square
    shape gives the machine's ceiling; a model's own shapes give the best its GEMMs can do."""
    m, k, n = shape
    a = tf.cast(tf.random.normal([repeats, m, k]), dtype)
    b = tf.cast(tf.random.normal([k, n]) / k ** 0.5, dtype)

    @tf.function
    def products(a):
        total = tf.constant(0.0)
        for i in range(repeats):
            total += tf.cast(tf.matmul(a[i], b)[0, 0], tf.float32)
        return total

    products(a).numpy()  # trace and warm up
    rates = []
    for _ in range(windows):
        start = time.perf_counter()
        products(a).numpy()
        rates.append(2 * m * k * n * repeats / (time.perf_counter() - start) / 1e9)
    return statistics.median(rates)


def forward_flops(source_lengths, target_lengths, settings):
    """Matmul FLOPs of one forward pass over pairs of these real (unpadded) lengths.

    Per encoder layer and source position: Q/K/V/O projections 4·2d², FFN 2·2·d·d_ff, attention
    scores and sums 2·2·S·d. Per decoder layer and target position: self Q/K/V/O 4·2d², cross
    Q/O 2·2d², FFN, self attention 2·2·T·d, cross attention 2·2·S·d; cross K/V 2·2d² per source
    position. Output projection 2·d·V per target position. Element-wise work is not counted.
    """
    d, d_ff = settings["d_model"], settings["d_ff"]
    vocab = settings["target_vocab_size"]
    n_enc, n_dec = settings["num_encoder_layers"], settings["num_decoder_layers"]
    total = 0
    for s, t in zip(source_lengths, target_lengths):
        enc = s * (8 * d * d + 4 * d * d_ff) + 4 * s * s * d
        dec = t * (8 * d * d + 4 * d * d + 4 * d * d_ff) + 4 * d * d * s + 4 * t * t * d \
            + 4 * t * s * d
        total += n_enc * enc + n_dec * dec + 2 * d * vocab * t
    return total


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def prepared_data(data_dir):
    """Prepares the embedded corpus into `data_dir` (once; later runs reuse it)."""
    from tfnmt import records

    return records.prepare(data_dir, "embedded", None, None, 8000, "unigram")


def cpu_description():
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), "unknown CPU")
    except OSError:
        model = "unknown CPU"
    return f"{model}, {os.cpu_count()} cores"


def define_trainer_flags():
    """--preset, --mixed_precision and --jit_compile, the flags build_trainer takes."""
    from absl import flags

    flags.DEFINE_string("preset", "small", "Model preset.")
    flags.DEFINE_enum("mixed_precision", "auto", ["auto", "none", "bf16"], "As train.py.")
    flags.DEFINE_bool("jit_compile", False, "XLA-compile the train step.")


def build_trainer(preset, precision, vocab_size, jit_compile=False):
    """The train.py training set-up on one device: (model, Trainer), with Keras's global dtype
    policy set for `precision` ("bf16" or "none") and seed 1."""
    import keras

    from tfnmt.distribute import PreReducedAdam, make_strategy
    from tfnmt.experiment import POLICIES
    from tfnmt.model import Transformer
    from tfnmt.presets import get_preset
    from tfnmt.schedule import paper_adam
    from tfnmt.training import Trainer

    keras.utils.set_random_seed(1)
    keras.config.set_dtype_policy(POLICIES[precision])
    strategy = make_strategy("one_device")
    with strategy.scope():
        model = Transformer(**dict(get_preset(preset), vocab_size=vocab_size))
        model.build()
        optimizer = paper_adam(model.d_model, 4000, 1.0, PreReducedAdam)
        optimizer.build(model.trainable_variables)
    return model, Trainer(model, optimizer, strategy, jit_compile=jit_compile)
