import numpy as np
import pytest
import tensorflow as tf

from tfnmt.inference import serving_precision
from tfnmt.inference.serving_precision import SearchPrecision, bf16_speedup, has_native_bf16

AMX = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
AVX512_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni avx512_bf16\n"
AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma avx512f avx512_vnni\n"


def test_native_bf16_is_read_from_the_cpu_flags(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    amx_last = "flags\t\t: avx512f amx_tile amx_bf16\n"
    near_misses = "flags\t\t: xavx512_bf16 avx512_bf16x xamx_bf16 amx_bf16x amx_tile\n"
    for text, native in ((AMX, True), (AVX512_BF16, True), (amx_last, True), (AVX2, False),
                         (near_misses, False), ("", False)):
        cpuinfo.write_text(text)
        assert bool(has_native_bf16(str(cpuinfo))) == native, text
    assert not bool(has_native_bf16(str(tmp_path / "missing")))


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
                                min_speedup)
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
    precision = SearchPrecision(tf.Variable(tf.ones([10, 4])), str(cpuinfo), min_speedup)
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
