"""Which CPU kernels TensorFlow runs: oneDNN's or Eigen's.

TensorFlow turns its oneDNN kernels on by default only on x86 CPUs with AVX512_VNNI,
AVX512-BF16, AVX-VNNI or AMX; on the many CPUs with AVX2 and FMA but none of those it runs
Eigen's. There oneDNN's large float32 matrix products are faster, and training gains: on an
AMD EPYC with AVX2 only (2 cores) 2048^3 products ran 1.2-1.4x Eigen's rate and the `cpu`
preset trained 1.12-1.17x as many target tokens/s. Decoding's many small products lose:
the same machine's beam search ran 0.88x and greedy search 0.74x as fast with oneDNN
(bench/README.md). oneDNN has no bf16 kernels below AVX-512 and leaves bf16 ops to Eigen
there, so a bf16 run is no worse off.

So `use_onednn()` (train.py and the training benchmarks call it before TensorFlow is
imported) sets TF_ENABLE_ONEDNN_OPTS=1 on x86-64 Linux CPUs with AVX2 and FMA where
TensorFlow would leave oneDNN off, unless the environment sets TF_ENABLE_ONEDNN_OPTS already
(`=0` keeps Eigen's kernels); the programs that decode keep TensorFlow's default
(`describe()` says which it is).
"""
import os
import platform
import sys

ENV = "TF_ENABLE_ONEDNN_OPTS"
# Set beside ENV when tfnmt turned oneDNN on (not the user): a peer toolkit the benchmarks
# start gets the environment its user gave, without it.
SET_BY_TFNMT = "TFNMT_ONEDNN_SET"
# The CPU features with which TensorFlow turns oneDNN on by itself (tensorflow/core/util/util.cc).
TENSORFLOW_ONEDNN_FEATURES = {"avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16",
                              "amx_int8"}


def cpu_flags(cpuinfo="/proc/cpuinfo"):
    """The feature flags of the first CPU in `cpuinfo` (a set; empty where unreadable)."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _choice(environ, cpuinfo):
    """(what the process runs, whether tfnmt should set TF_ENABLE_ONEDNN_OPTS=1 for training)."""
    if environ.get(SET_BY_TFNMT) and environ.get(ENV) == "1":
        return "oneDNN (set by tfnmt)", False  # a re-executed process, or a child of train.py
    given = environ.get(ENV, "").strip()
    if given:
        on = given.lower() in ("1", "true")
        return f"{'oneDNN' if on else 'Eigen'} ({ENV}={given})", False
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        return "TensorFlow's default", False
    features = cpu_flags(cpuinfo)
    if features & TENSORFLOW_ONEDNN_FEATURES:
        return "oneDNN (TensorFlow's default here)", False
    if not {"avx2", "fma"} <= features:
        return "TensorFlow's default", False
    return "Eigen (TensorFlow's default here)", True


def describe(environ=os.environ, cpuinfo="/proc/cpuinfo"):
    """What TensorFlow will run in this process, for the log (see `use_onednn`), unchanged."""
    return _choice(environ, cpuinfo)[0]


def use_onednn(environ=os.environ, cpuinfo="/proc/cpuinfo"):
    """Turns TensorFlow's oneDNN kernels on for training where TensorFlow leaves them off.

    Must run before TensorFlow is imported (TensorFlow reads the variable once).

    Args:
      environ: the environment to change (os.environ).
      cpuinfo: where the CPU's flags are read.

    Returns:
      What the process will run, for the log: "oneDNN (set by tfnmt)", "oneDNN
      (TensorFlow's default here)", "oneDNN (TF_ENABLE_ONEDNN_OPTS=1)", "Eigen
      (TF_ENABLE_ONEDNN_OPTS=0)", or "TensorFlow's default" on other platforms and CPUs.
    """
    description, turn_on = _choice(environ, cpuinfo)
    if not turn_on:
        return description
    environ[ENV] = "1"
    environ[SET_BY_TFNMT] = "1"
    return "oneDNN (set by tfnmt)"


def user_environment(environ=os.environ):
    """A copy of `environ` without the oneDNN setting tfnmt made (what the user gave)."""
    env = dict(environ)
    if env.pop(SET_BY_TFNMT, None):
        env.pop(ENV, None)
    return env


# oneDNN's ISA names (ONEDNN_MAX_CPU_ISA) from AVX-512 up hold bfloat16 kernels, native or
# emulated; a cap below them (SSE41, AVX, AVX2, AVX2_VNNI, ...) leaves oneDNN none.
_ISA_WORDS_FROM_AVX512 = ("AVX512", "AVX10", "AMX", "ALL", "DEFAULT")
# Those that keep native bfloat16 instructions (AVX512_CORE only emulates them): training's
# `auto` (precision.cpu_has_bf16) and an `auto` export's search (serving_precision) take
# bfloat16 only under these or no cap.
BF16_ISA_WORDS = ("ALL", "BF16", "FP16", "AMX", "AVX10")


def bf16_abort_reason(environ=os.environ, cpuinfo="/proc/cpuinfo"):
    """Why a bfloat16 matrix product would abort this process, or None where it runs.

    TensorFlow hands bfloat16 products to oneDNN on CPUs with AVX-512 when oneDNN is on; under
    an ONEDNN_MAX_CPU_ISA below AVX-512 oneDNN then has no kernel for them and the process
    aborts (`dnnl::error`, not a Python exception). Measured on an AMD EPYC with AVX512-BF16:
    AVX2 aborts, AVX512_CORE runs. On CPUs without AVX-512, or with oneDNN off, TensorFlow
    runs them with Eigen's kernels.

    Args:
      environ: the environment the process was started with.
      cpuinfo: where the CPU's flags are read.

    Returns:
      A sentence for an error message, or None.
    """
    cap = environ.get("ONEDNN_MAX_CPU_ISA", "").strip()
    if not cap or any(word in cap.upper() for word in _ISA_WORDS_FROM_AVX512):
        return None
    if not _choice(environ, cpuinfo)[0].startswith("oneDNN") \
            or "avx512f" not in cpu_flags(cpuinfo):
        return None
    return (f"oneDNN capped at ONEDNN_MAX_CPU_ISA={cap} has no bfloat16 kernels, and a "
            "bfloat16 product would abort the process")
