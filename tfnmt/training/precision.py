"""Which mixed precision to train in: `--mixed_precision=auto` times this CPU's products.

Native bfloat16 is not always faster than float32: with AVX512-BF16 but no AMX, an Intel Xeon
ran bf16 products at 0.6x the float32 rate (CHANGELOG.md), where an AMD Zen 4 EPYC runs them at
about 1.9x. So `auto` on a CPU with native bfloat16 times products in both dtypes and keeps
bfloat16 where it is at least BF16_MIN_SPEEDUP times faster. The timing windows of the two
dtypes alternate and the fastest of each counts (`fastest_interleaved`): a burst of load from
elsewhere on the machine (another process, a busy virtual machine host) then slows windows of
both dtypes rather than all of one's, which made bf16 look slower than float32 where it is not.
"""
import os

import tensorflow as tf

from tfnmt import cpu_kernels
from tfnmt.training.settings import SettingsError

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # Linux CPU flags of native bfloat16

# bfloat16 training is chosen where its products run at least this much faster than float32's.
BF16_MIN_SPEEDUP = 1.15


def cpu_has_bf16(cpuinfo="/proc/cpuinfo"):
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX, by the Linux CPU flags
    in `cpuinfo`) and oneDNN may use it (ONEDNN_MAX_CPU_ISA unset or at a bf16 ISA)."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if cap and not any(word in cap for word in cpu_kernels.BF16_ISA_WORDS):
        return False
    return any(flag in cpu_kernels.cpu_flags(cpuinfo) for flag in NATIVE_BF16_FLAGS)


def fastest_interleaved(time_window, keys, windows, minimum=min):
    """The fastest of `windows` timings of each key, timed in turn: key 1, key 2, ..., key 1, ...

    A first, untimed round builds each key's kernels. Alternating keys means a slow period
    shorter than all but one round slows windows of every key alike, and the fastest window of
    each then still ran outside it.

    Args:
      time_window: key -> seconds of one window (a float, or a tensor in a graph).
      keys: what to time, e.g. dtypes.
      windows: timed windows per key.
      minimum: the minimum of two timings (`tf.minimum` for tensors).

    Returns:
      {key: its fastest window's seconds}.
    """
    for key in keys:
        time_window(key)
    fastest = {}
    for _ in range(windows):
        for key in keys:
            seconds = time_window(key)
            fastest[key] = seconds if key not in fastest else minimum(fastest[key], seconds)
    return fastest


def bf16_matmul_speedup(rows=1024, depth=256, cols=1024, products=4, windows=8):
    """How many times faster this CPU multiplies [rows, depth]·[depth, cols] in bfloat16 than
    in float32: the fastest of `windows` windows of `products` products each, the two dtypes'
    windows alternating (`fastest_interleaved`); about 0.3 s."""
    import time

    with tf.device("/CPU:0"):
        operands = {dtype: (tf.cast(tf.random.stateless_normal([rows, depth], [1, 2]), dtype),
                            tf.cast(tf.random.stateless_normal([depth, cols], [3, 4]), dtype))
                    for dtype in (tf.float32, tf.bfloat16)}

        def time_window(dtype):
            a, b = operands[dtype]
            start = time.perf_counter()
            for _ in range(products):
                product = tf.matmul(a, b)
            product.numpy()
            return time.perf_counter() - start

        fastest = fastest_interleaved(time_window, list(operands), windows)
    return fastest[tf.float32] / fastest[tf.bfloat16]


def resolve_mixed_precision(name, bf16_speedup=bf16_matmul_speedup):
    """The mixed precision to train with, and why where `auto` chose it.

    Args:
      name: "auto", "none", "bf16" or "fp16".
      bf16_speedup: () -> this CPU's bf16/float32 matmul speed ratio (for "auto" on a CPU
        with native bf16).

    Returns:
      (precision, reason). precision for "auto": "bf16" on GPUs of compute capability >= 8.0,
      and on CPUs with native bf16 whose bf16 products run at least BF16_MIN_SPEEDUP times
      faster than float32's; else "none"; any other name as given. reason: for "auto", a few
      words for the log (e.g. "auto: bf16 products timed 1.93x float32's"); else "".

    Raises:
      SettingsError: "bf16" on a CPU where a bfloat16 product would abort the process
        (`cpu_kernels.bf16_abort_reason`).
    """
    gpus = tf.config.list_physical_devices("GPU")
    if name == "bf16" and not gpus:
        reason = cpu_kernels.bf16_abort_reason()
        if reason:
            raise SettingsError(f"--mixed_precision=bf16: {reason}; train with "
                                "--mixed_precision=none or auto, or lift the cap")
    if name != "auto":
        return name, ""
    if gpus:
        capability = tuple(tf.config.experimental.get_device_details(gpus[0]).get(
            "compute_capability", (0, 0)))
        return ("bf16" if capability >= (8, 0) else "none",
                "auto: GPU compute capability " + ".".join(map(str, capability)))
    if not cpu_has_bf16():
        return "none", "auto: no native bf16 on this CPU"
    speedup = bf16_speedup()
    return ("bf16" if speedup >= BF16_MIN_SPEEDUP else "none",
            f"auto: bf16 products timed {speedup:.2f}x float32's")
