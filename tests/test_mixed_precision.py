"""Which precision `--mixed_precision=auto` trains in on a CPU."""
import pytest

from tfnmt.training import distribute


def fail_probe():
    raise AssertionError("the bf16 speed probe ran where bf16 is not native")


@pytest.mark.parametrize("name", ["none", "bf16", "fp16"])
def test_explicit_precisions_are_kept(monkeypatch, name):
    from tfnmt import cpu_kernels

    monkeypatch.setattr(cpu_kernels, "bf16_abort_reason", lambda: None)  # whatever the cap here
    assert distribute.resolve_mixed_precision(name, bf16_speedup=fail_probe) == name


@pytest.mark.parametrize("speedup, expected", [(0.6, "none"), (1.1, "none"), (1.15, "bf16"),
                                               (2.5, "bf16")])
def test_auto_takes_bf16_only_where_its_products_are_faster(monkeypatch, speedup, expected):
    monkeypatch.setattr(distribute, "cpu_has_bf16", lambda: True)
    assert distribute.resolve_mixed_precision("auto", bf16_speedup=lambda: speedup) == expected


def test_auto_does_not_probe_without_native_bf16(monkeypatch):
    monkeypatch.setattr(distribute, "cpu_has_bf16", lambda: False)
    assert distribute.resolve_mixed_precision("auto", bf16_speedup=fail_probe) == "none"


@pytest.mark.parametrize("cap, allowed", [("AVX2", False), ("avx512_core", False),
                                          ("AVX512_CORE_VNNI", False), ("AVX512_CORE_BF16", True),
                                          ("AVX512_CORE_AMX", True), ("ALL", True), ("", True)])
def test_an_isa_cap_below_bf16_means_no_native_bf16(monkeypatch, tmp_path, cap, allowed):
    # Under such a cap oneDNN aborts the process on a bf16 matmul: it must not be chosen.
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert distribute.cpu_has_bf16(str(cpuinfo)) == allowed
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni\n")
    assert not distribute.cpu_has_bf16(str(cpuinfo))
    assert not distribute.cpu_has_bf16(str(tmp_path / "missing"))


def test_the_speed_probe_times_both_dtypes():
    speedup = distribute.bf16_matmul_speedup(rows=64, depth=32, cols=64, repeats=2)
    assert 0.01 < speedup < 100


def test_bf16_is_refused_where_its_products_would_abort_the_process(monkeypatch):
    from tfnmt import cpu_kernels
    from tfnmt.training.settings import SettingsError

    monkeypatch.setattr(cpu_kernels, "bf16_abort_reason", lambda: "capped for the test")
    with pytest.raises(SettingsError, match="--mixed_precision=bf16: capped for the test"):
        distribute.resolve_mixed_precision("bf16", bf16_speedup=fail_probe)
    monkeypatch.setattr(distribute, "cpu_has_bf16", lambda: False)
    assert [distribute.resolve_mixed_precision(name, bf16_speedup=fail_probe)
            for name in ("none", "fp16", "auto")] == ["none", "fp16", "none"]
