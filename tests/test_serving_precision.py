import os
import subprocess
import sys

import pytest
import tensorflow as tf

from tfnmt.inference import serving_precision
from tfnmt.inference.serving_precision import SearchPrecision, bf16_speedup, has_native_bf16

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AMX = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
AVX512_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni avx512_bf16\n"
AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma avx512f avx512_vnni\n"


def no_cap(tmp_path):
    """An environment file without ONEDNN_MAX_CPU_ISA (the suite itself may run under one)."""
    path = tmp_path / "environ"
    path.write_bytes(b"PATH=/usr/bin\x00")
    return str(path)


def test_native_bf16_is_read_from_the_cpu_flags(tmp_path):
    environ = no_cap(tmp_path)
    cpuinfo = tmp_path / "cpuinfo"
    amx_last = "flags\t\t: avx512f amx_tile amx_bf16\n"
    near_misses = "flags\t\t: xavx512_bf16 avx512_bf16x xamx_bf16 amx_bf16x amx_tile\n"
    for text, native in ((AMX, True), (AVX512_BF16, True), (amx_last, True), (AVX2, False),
                         (near_misses, False), ("", False)):
        cpuinfo.write_text(text)
        assert bool(has_native_bf16(str(cpuinfo), environ)) == native, text
    assert not bool(has_native_bf16(str(tmp_path / "missing"), environ))


@pytest.mark.parametrize("environ, bf16", [
    (b"A=1\x00ONEDNN_MAX_CPU_ISA=AVX2\x00B=2\x00", False),  # a product would abort there
    (b"ONEDNN_MAX_CPU_ISA=AVX2", False),
    (b"ONEDNN_MAX_CPU_ISA=AVX512_CORE\x00", False),           # emulated bf16: slow
    (b"ONEDNN_MAX_CPU_ISA=avx512_core_bf16\x00", True),
    (b"ONEDNN_MAX_CPU_ISA=AVX512_CORE_AMX\x00", True),
    (b"ONEDNN_MAX_CPU_ISA=ALL\x00", True),
    (b"ONEDNN_MAX_CPU_ISA=\x00", True),                       # empty: no cap
    (b"XONEDNN_MAX_CPU_ISA=AVX2\x00", True),                   # other variables
    (b"X=ONEDNN_MAX_CPU_ISA=AVX2\x00", True),
    (b"X=1\nONEDNN_MAX_CPU_ISA=AVX2\x00", True),
    (b"", True),
    (None, True),                                             # no file: no cap known
])
def test_a_cap_below_bf16_in_the_environment_means_float32(tmp_path, environ, bf16):
    # The same rule as training's (distribute.cpu_has_bf16), read from the serving process'
    # environment (/proc/self/environ: NAME=value entries separated by NUL bytes).
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(AMX)
    path = tmp_path / "environ"
    if environ is not None:
        path.write_bytes(environ)
    assert bool(has_native_bf16(str(cpuinfo), str(path))) == bf16
    cpuinfo.write_text(AVX2)
    assert not bool(has_native_bf16(str(cpuinfo), str(path)))


READ_IN_THE_GRAPH = """
import sys
sys.path.insert(0, sys.argv[1])
from tfnmt.inference.serving_precision import has_native_bf16
print(bool(has_native_bf16(sys.argv[2])))
"""


def test_the_graph_reads_the_serving_process_environment(tmp_path):
    # /proc/self/environ of the process that runs the graph: a server started under the AVX2
    # cap searches in float32 (oneDNN off in both, so no bf16 product can run here).
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(AMX)
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
    env["TF_ENABLE_ONEDNN_OPTS"] = "0"
    children = {cap: subprocess.Popen(
        [sys.executable, "-c", READ_IN_THE_GRAPH, ROOT, str(cpuinfo)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        env=dict(env, ONEDNN_MAX_CPU_ISA=cap) if cap else env) for cap in ("AVX2", None)}
    for cap, child in children.items():
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err[-2000:]
        assert out.split() == (["False"] if cap else ["True"])


def test_the_speedup_is_a_ratio_of_timed_products():
    # Eagerly and in a tf.function (as in the export, where the graph optimizer must not
    # prune the timed products): a window that timed nothing would give 0 (float32) or a
    # ratio of about 1e9 (bfloat16). bf16 emulated in software runs at ~0.05-0.2x float32.
    weights = tf.random.normal([1000, 64])
    timed = tf.function(lambda w: bf16_speedup(w, rows=8, repeats=2, windows=2),
                        autograph=False)
    for ratio in (bf16_speedup(weights, rows=8, repeats=2, windows=2), timed(weights),
                  timed(weights)):
        assert 1e-3 < float(ratio) < 1e3


@pytest.mark.parametrize("flags, min_speedup, bf16", [
    (AMX, 0.0, True),            # native and timed faster than the threshold
    (AVX512_BF16, 0.0, True),
    (AMX, 1e9, False),           # native, but not that much faster
    (AVX2, 0.0, False),          # emulated: never bf16, whatever the timing would say
])
def test_the_choice_needs_native_bf16_and_a_faster_timing(tmp_path, flags, min_speedup, bf16):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(flags)
    precision = SearchPrecision(tf.Variable(tf.random.normal([100, 16])), str(cpuinfo),
                                min_speedup, environ=no_cap(tmp_path))
    assert int(precision.choice.numpy()) == -1
    assert bool(precision.prefers_bf16()) == bf16
    assert int(precision.choice.numpy()) == int(bf16)


def precision_timed_as(tmp_path, monkeypatch, flags, ratio, min_speedup):
    """A SearchPrecision on a CPU with `flags` whose timing returns `ratio` and counts its runs
    (in the graph). -> (precision, its prefers_bf16 as a tf.function, the run count)."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(flags)
    runs = tf.Variable(0)

    def speedup(weights):
        with tf.control_dependencies([runs.assign_add(1)]):
            return tf.constant(ratio, tf.float64)

    monkeypatch.setattr(serving_precision, "bf16_speedup", speedup)
    precision = SearchPrecision(tf.Variable(tf.ones([10, 4])), str(cpuinfo), min_speedup,
                                environ=no_cap(tmp_path))
    return precision, tf.function(precision.prefers_bf16, autograph=False), runs


def test_no_timing_without_native_bf16(tmp_path, monkeypatch):
    precision, prefers, runs = precision_timed_as(tmp_path, monkeypatch, AVX2, 9.0, 0.0)
    assert not bool(prefers()) and not bool(precision.prefers_bf16())
    assert int(runs.numpy()) == 0


def test_the_first_call_decides_for_the_process(tmp_path, monkeypatch):
    precision, prefers, runs = precision_timed_as(tmp_path, monkeypatch, AMX, 2.0, 1.15)
    assert bool(prefers())
    (tmp_path / "cpuinfo").write_text(AVX2)  # later calls neither read the flags nor time again
    assert bool(prefers()) and bool(prefers()) and bool(precision.prefers_bf16())
    assert int(precision.choice.numpy()) == 1 and int(runs.numpy()) == 1
