"""Which precision `--mixed_precision=auto` trains in on a CPU."""
import pytest

from tfnmt.training import precision


def fail_probe():
    raise AssertionError("the bf16 speed probe ran where bf16 is not native")


@pytest.mark.parametrize("name", ["none", "bf16", "fp16"])
def test_explicit_precisions_are_kept(monkeypatch, name):
    from tfnmt import cpu_kernels

    monkeypatch.setattr(cpu_kernels, "bf16_abort_reason", lambda: None)  # whatever the cap here
    assert precision.resolve_mixed_precision(name, bf16_speedup=fail_probe) == (name, "")


@pytest.mark.parametrize("speedup, expected", [(0.6, "none"), (1.1, "none"), (1.15, "bf16"),
                                               (2.5, "bf16")])
def test_auto_takes_bf16_only_where_its_products_are_faster(monkeypatch, speedup, expected):
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    assert precision.resolve_mixed_precision("auto", bf16_speedup=lambda: speedup) == (
        expected, f"auto: bf16 products timed {speedup:.2f}x float32's")


def test_auto_does_not_probe_without_native_bf16(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    assert precision.resolve_mixed_precision("auto", bf16_speedup=fail_probe) == (
        "none", "auto: no native bf16 on this CPU")


@pytest.mark.parametrize("cap, allowed", [("AVX2", False), ("avx512_core", False),
                                          ("AVX512_CORE_VNNI", False), ("AVX512_CORE_BF16", True),
                                          ("AVX512_CORE_AMX", True), ("ALL", True), ("", True)])
def test_an_isa_cap_below_bf16_means_no_native_bf16(monkeypatch, tmp_path, cap, allowed):
    # Under such a cap oneDNN aborts the process on a bf16 matmul: it must not be chosen.
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert precision.cpu_has_bf16(str(cpuinfo)) == allowed
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni\n")
    assert not precision.cpu_has_bf16(str(cpuinfo))
    assert not precision.cpu_has_bf16(str(tmp_path / "missing"))


def test_the_speed_probe_times_both_dtypes():
    speedup = precision.bf16_matmul_speedup(rows=64, depth=32, cols=64, products=2, windows=2)
    assert 0.01 < speedup < 100


def test_bf16_is_refused_where_its_products_would_abort_the_process(monkeypatch):
    from tfnmt import cpu_kernels
    from tfnmt.training.settings import SettingsError

    monkeypatch.setattr(cpu_kernels, "bf16_abort_reason", lambda: "capped for the test")
    with pytest.raises(SettingsError, match="--mixed_precision=bf16: capped for the test"):
        precision.resolve_mixed_precision("bf16", bf16_speedup=fail_probe)
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    assert [precision.resolve_mixed_precision(name, bf16_speedup=fail_probe)[0]
            for name in ("none", "fp16", "auto")] == ["none", "fp16", "none"]


def bursty_clock(seconds, burst_start, burst_length, slowdown=3.0):
    """A window timer for `fastest_interleaved`: key k's window takes seconds[k], `slowdown`
    times that in calls burst_start .. burst_start + burst_length - 1 (load from elsewhere).
    -> (time_window, the keys timed, in order)."""
    calls = []

    def time_window(key):
        calls.append(key)
        loaded = burst_start <= len(calls) - 1 < burst_start + burst_length
        return seconds[key] * (slowdown if loaded else 1.0)

    return time_window, calls


def test_a_burst_of_load_cannot_change_the_timed_ratio():
    # A burst of up to half the probe's windows, anywhere: the fastest window of each key ran
    # outside it. Timing one key's windows after the other's, a burst over the second key's
    # windows alone would make bf16 look 3x slower and cost the run its precision.
    seconds, windows = {"float32": 2.0, "bfloat16": 1.0}, 4
    calls_in_all = len(seconds) * (windows + 1)
    for burst_start in range(calls_in_all):
        for burst_length in range(windows + 1):
            time_window, calls = bursty_clock(seconds, burst_start, burst_length)
            fastest = precision.fastest_interleaved(time_window, list(seconds), windows)
            assert fastest == seconds, (burst_start, burst_length)
            assert len(calls) == calls_in_all
    # The first round builds kernels: it does not count, not even when it is the fastest.
    time_window, calls = bursty_clock(seconds, 0, 2, slowdown=0.1)
    assert precision.fastest_interleaved(time_window, list(seconds), windows) == seconds
    assert calls == ["float32", "bfloat16"] * (windows + 1)


def test_the_probe_passes_tensors_through_the_given_minimum():
    import tensorflow as tf

    timings = iter([9.0, 9.0, 3.0, 1.0, 2.0, 4.0])
    fastest = precision.fastest_interleaved(lambda key: tf.constant(next(timings)), ["a", "b"],
                                            2, minimum=tf.minimum)
    assert {key: float(value) for key, value in fastest.items()} == {"a": 2.0, "b": 1.0}
