"""Helpers shared by the benchmarks: the matmul ceiling, model FLOPs, RSS, prepared data."""
import math
import os
import resource
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfnmt import allocator, cpu_kernels, tensorflow_start  # noqa: E402

# The benchmarks measure what the entry points get: the same allocator (may re-exec once), and
# train.py's CPU kernels in the training benchmarks (oneDNN on AVX2 CPUs), TensorFlow's
# default (what translate.py and a server run) in the others.
MALLOC = allocator.use_fast_allocator()
TRAINING_BENCHMARKS = ("train.py", "train_step.py")
KERNELS = (cpu_kernels.use_onednn() if os.path.basename(sys.argv[0]) in TRAINING_BENCHMARKS
           else cpu_kernels.describe())
tensorflow_start.install()  # without the lines TensorFlow's libraries print as it starts

import tensorflow as tf  # noqa: E402

from tfnmt.training.summaries import rss_bytes  # noqa: E402,F401  (re-exported for the benchmarks)


def peer_environment(malloc, **extra):
    """os.environ for an OpenNMT-tf process, plus `extra`, with its C allocator as `malloc`
    says: 'system' (glibc, what its users get) or 'tcmalloc' (what tfnmt's entry points preload
    where it is installed, or the library TFNMT_MALLOC names). Its CPU kernels are
    TensorFlow's choice unless the user's environment sets TF_ENABLE_ONEDNN_OPTS."""
    env = {k: v for k, v in cpu_kernels.user_environment().items()
           if not k.startswith("TFNMT_MALLOC")}
    preload = [p for p in env.pop("LD_PRELOAD", "").split(":")
               if p and not any(name in os.path.basename(p) for name in allocator.LIBRARY_NAMES)]
    if malloc == "tcmalloc":
        chosen = os.environ.get(allocator.ENV, "")
        library = chosen if os.path.sep in chosen else allocator.find_tcmalloc()
        if library is None:
            raise RuntimeError("--peer_malloc=tcmalloc: no libtcmalloc on this machine")
        preload.insert(0, library)
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    return {**env, **extra}


def matmul_ceiling(dtype, shape=(2048, 2048, 2048), repeats=8, windows=5):
    """Sustained GFLOP/s of [m, k] x [k, n] matmuls in `dtype` (median over `windows` timings of
    `repeats` independent products per call), on this process' threads. The default square
    shape gives the machine's ceiling; a model's own shapes give the best its GEMMs can do."""
    m, k, n = shape
    seconds = _seconds_per_product((m, k), (k, n), False, False, dtype, repeats, windows)
    return 2 * m * k * n / seconds / 1e9


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


def padded_forward_flops(source_length, target_length, target_lengths, settings):
    """Matmul FLOPs of one forward pass over a batch padded to [B, source_length] /
    [B, target_length] as the training step runs it: the encoder and decoder over every
    position, padded or not; the output projection over the real target positions only (the
    loss gathers those rows first, losses.projected_cross_entropy; not under --jit_compile).

    Args:
      source_length, target_length: the batch's padded lengths.
      target_lengths: each row's real target length (B of them).
      settings: the model's settings, as for `forward_flops`.
    """
    rows = len(target_lengths)
    padded = forward_flops([source_length] * rows, [target_length] * rows, settings)
    unused = 2 * settings["d_model"] * settings["target_vocab_size"] * (
        rows * target_length - sum(target_lengths))
    return padded - unused


def training_gemms(settings, batch_size, source_length, target_length):
    """The matrix products of one training step on a padded [batch_size, source_length] /
    [batch_size, target_length] batch, as {(shape_a, shape_b, transpose_a, transpose_b): count}:
    each projection's forward, input-gradient, kernel-gradient and bias-gradient GEMMs
    (layers/linear.py), attention's batched products and their two gradients each, and the tied
    softmax's three GEMMs (losses.projected_cross_entropy). Element-wise work is left out."""
    d, d_ff, vocab = settings["d_model"], settings["d_ff"], settings["target_vocab_size"]
    heads = settings["num_heads"]
    n_enc, n_dec = settings["num_encoder_layers"], settings["num_decoder_layers"]
    source_rows, target_rows = batch_size * source_length, batch_size * target_length
    gemms = {}

    def add(a, b, transpose_a=False, transpose_b=False, count=1):
        key = (tuple(a), tuple(b), transpose_a, transpose_b)
        gemms[key] = gemms.get(key, 0) + count

    def projection(rows, d_in, d_out, count):  # y = x W + b and its gradients
        add([rows, d_in], [d_in, d_out], count=count)
        add([rows, d_out], [d_in, d_out], transpose_b=True, count=count)  # dx
        add([rows, d_in], [rows, d_out], transpose_a=True, count=count)  # dW
        add([1, rows], [rows, d_out], count=count)  # db

    def attention(query_length, key_length, count):  # per head: Q K^T, then weights V
        bh, dh = batch_size * heads, d // heads
        add([bh, query_length, dh], [bh, key_length, dh], transpose_b=True, count=count)
        add([bh, query_length, key_length], [bh, key_length, dh], count=count)  # dq
        add([bh, query_length, key_length], [bh, query_length, dh], transpose_a=True,
            count=count)  # dk
        add([bh, query_length, key_length], [bh, key_length, dh], count=count)  # weights V
        add([bh, query_length, dh], [bh, key_length, dh], transpose_b=True,
            count=count)  # dweights
        add([bh, query_length, key_length], [bh, query_length, dh], transpose_a=True,
            count=count)  # dv

    projection(source_rows, d, d, 4 * n_enc + 2 * n_dec)  # encoder Q/K/V/O, cross K/V
    projection(source_rows, d, d_ff, n_enc)
    projection(source_rows, d_ff, d, n_enc)
    projection(target_rows, d, d, 6 * n_dec)  # decoder self Q/K/V/O, cross Q/O
    projection(target_rows, d, d_ff, n_dec)
    projection(target_rows, d_ff, d, n_dec)
    attention(source_length, source_length, n_enc)
    attention(target_length, target_length, n_dec)
    attention(target_length, source_length, n_dec)
    add([target_rows, d], [vocab, d], transpose_b=True)  # logits
    add([target_rows, vocab], [vocab, d])  # hidden gradient
    add([target_rows, vocab], [target_rows, d], transpose_a=True)  # kernel gradient
    return gemms


def matmul_seconds(shape_a, shape_b, transpose_a, transpose_b, dtype, min_seconds=0.05,
                   windows=5, max_bytes=2 ** 28):
    """Seconds per product of this shape in `dtype` on this process' threads, timed as
    `matmul_ceiling` times its products: enough of them for `min_seconds` (at most 64, and
    `max_bytes` of left operands). An optimistic figure: the right operand stays in cache
    from one product to the next, and the runtime may overlap them as it would in a step."""
    once = _seconds_per_product(shape_a, shape_b, transpose_a, transpose_b, dtype, 1, windows)
    bytes_a = tf.as_dtype(dtype).size * math.prod(shape_a)
    repeats = min(64, int(min_seconds / max(once, 1e-6)), max_bytes // bytes_a)
    return once if repeats <= 1 else _seconds_per_product(
        shape_a, shape_b, transpose_a, transpose_b, dtype, repeats, windows)


def _seconds_per_product(shape_a, shape_b, transpose_a, transpose_b, dtype, repeats, windows):
    """The median over `windows` timings of one graph of `repeats` independent products, each
    with its own left operand (so that the runtime can neither merge nor skip any), divided
    by `repeats`."""
    a = tf.cast(tf.random.normal([repeats, *shape_a]), dtype)
    b = tf.cast(tf.random.normal(shape_b) / shape_b[-1] ** 0.5, dtype)

    @tf.function
    def products(a):
        total = tf.constant(0.0)
        for i in range(repeats):
            product = tf.matmul(a[i], b, transpose_a=transpose_a, transpose_b=transpose_b)
            total += tf.cast(tf.reshape(product, [-1])[0], tf.float32)
        return total

    products(a).numpy()  # trace and warm up
    times = []
    for _ in range(windows):
        start = time.perf_counter()
        products(a).numpy()
        times.append(time.perf_counter() - start)
    return statistics.median(times) / repeats


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# OpenNMT-tf's Transformer with a tfnmt model's shape: shared embeddings and softmax, dropout on
# residuals and embeddings (and attention where the model has it), none in the feed-forward
# layer, LayerNorm where the model puts it (OpenNMT-tf's own default is pre-norm; `small` and
# `base` are post-norm, as the paper).
PEER_MODEL = """import opennmt

def model():
    return opennmt.models.Transformer(
        source_inputter=opennmt.inputters.WordEmbedder(embedding_size={d_model}),
        target_inputter=opennmt.inputters.WordEmbedder(embedding_size={d_model}),
        num_layers={num_layers}, num_units={d_model}, num_heads={num_heads},
        ffn_inner_dim={d_ff}, dropout={dropout}, attention_dropout={attention_dropout},
        ffn_dropout=0.0, pre_norm={pre_norm},
        share_embeddings=opennmt.models.EmbeddingsSharingLevel.ALL)
"""

# Runs `onmt-main` after setting Keras's global policy from PEER_POLICY (OpenNMT-tf enables
# mixed precision only on GPUs).
PEER_LAUNCHER = """import os, sys
import tensorflow as tf
if os.environ.get("PEER_POLICY"):
    tf.keras.mixed_precision.set_global_policy(os.environ["PEER_POLICY"])
from opennmt.bin.main import main
sys.exit(main())
"""


def peer_model_script(model, dropout):
    """The model.py `onmt-main --model` reads for a tfnmt model of settings `model` (a preset
    or settings.json's "model"), with `dropout` on its residuals and embeddings."""
    return PEER_MODEL.format(
        d_model=model["d_model"], num_layers=model["num_layers"], num_heads=model["num_heads"],
        d_ff=model["d_ff"], dropout=dropout,
        attention_dropout=model.get("attention_dropout", 0.0),
        pre_norm=bool(model.get("norm_first", False)))


def prepared_data(data_dir):
    """Prepares the embedded corpus into `data_dir` (once; later runs reuse it)."""
    from tfnmt.data import records

    return records.prepare(data_dir, "embedded", None, None, 8000, "unigram")


def cpu_description():
    """The CPU as /proc/cpuinfo names it, with what tells same-named models apart, and the cap
    on oneDNN's instruction set where ONEDNN_MAX_CPU_ISA sets one: e.g. "AMD EPYC (family 25,
    model 1; AVX2), 2 cores" or "AMD EPYC (family 26, model 2; AVX2 AVX-512 AVX512-BF16),
    2 cores, oneDNN capped at AVX2"."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = set(fields.get("flags", "").split())
    isa = [name for flag, name in (("avx2", "AVX2"), ("avx512f", "AVX-512"),
                                   ("avx512_bf16", "AVX512-BF16"), ("amx_tile", "AMX"))
           if flag in flags]
    model = fields.get("model name", "unknown CPU")
    if "cpu family" in fields:
        model += (f" (family {fields['cpu family']}, model {fields.get('model', '?')}; "
                  f"{' '.join(isa) or 'no AVX2'})")
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip()
    return f"{model}, {os.cpu_count()} cores" + (f", oneDNN capped at {cap}" if cap else "")


def define_session_threads_flag(default="0:0"):
    """--session_threads=INTRA:INTER, the thread pools of the exports' sessions, as TF Serving's
    --tensorflow_intra_op_parallelism and --tensorflow_inter_op_parallelism size them."""
    import re

    from absl import flags

    flags.DEFINE_string("session_threads", default, "INTRA:INTER, the threads one op may use and "
                        "the threads that run independent ops (TF Serving's "
                        "--tensorflow_intra_op_parallelism and "
                        "--tensorflow_inter_op_parallelism); 0: TensorFlow's default, one per "
                        "core.")
    flags.register_validator("session_threads",
                             lambda v: re.fullmatch(r"\d+:\d+", v) is not None,
                             "--session_threads takes INTRA:INTER, e.g. 1:2")
    _listed_in_help("session_threads")


def session_threads():
    """(intra, inter) of --session_threads."""
    from absl import flags

    intra, inter = map(int, flags.FLAGS.session_threads.split(":"))
    return intra, inter


def define_trainer_flags():
    """--preset, --mixed_precision and --jit_compile, the flags build_trainer takes."""
    from absl import flags

    flags.DEFINE_string("preset", "small", "Model preset.")
    flags.DEFINE_enum("mixed_precision", "auto", ["auto", "none", "bf16"], "As train.py.")
    flags.DEFINE_bool("jit_compile", False, "XLA-compile the train step.")
    _listed_in_help("preset", "mixed_precision", "jit_compile")


def _listed_in_help(*names):
    """The named flags, defined here for a benchmark, become key flags of the benchmark run
    (sys.argv[0]), so that its --help lists them (absl lists the flags of the module run)."""
    from absl import flags

    for name in names:
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])


def build_trainer(preset, precision, vocab_size, jit_compile=False):
    """The train.py training set-up on one device: (model, Trainer), with Keras's global dtype
    policy set for `precision` ("bf16" or "none") and seed 1; a preset whose dropout starts
    after some epochs (`cpu`) trains without it, as its runs start."""
    import keras

    from tfnmt.model.presets import get_preset, get_training
    from tfnmt.model.transformer import Transformer
    from tfnmt.training.distribute import PreReducedAdam, make_strategy
    from tfnmt.training.experiment import POLICIES
    from tfnmt.training.schedule import paper_adam
    from tfnmt.training.trainer import Trainer

    keras.utils.set_random_seed(1)
    keras.config.set_dtype_policy(POLICIES[precision])
    strategy = make_strategy("one_device")
    with strategy.scope():
        model = Transformer(**dict(get_preset(preset), vocab_size=vocab_size))
        model.build()
        if get_training(preset)["dropout_from_epoch"]:
            for layer in model.residual_dropouts():
                layer.rate = 0.0
        optimizer = paper_adam(model.d_model, 4000, 1.0, PreReducedAdam)
        optimizer.build(model.trainable_variables)
    return model, Trainer(model, optimizer, strategy, jit_compile=jit_compile)
