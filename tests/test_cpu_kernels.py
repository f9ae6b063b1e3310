"""tfnmt/cpu_kernels.py: oneDNN on where TensorFlow would leave it off, and never against the
user's TF_ENABLE_ONEDNN_OPTS; checked against TensorFlow's own report (IsMklEnabled)."""
import os
import platform
import subprocess
import sys

import pytest

from tfnmt import cpu_kernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
x86_linux = pytest.mark.skipif(not sys.platform.startswith("linux")
                               or platform.machine() != "x86_64", reason="x86-64 Linux only")


def fake_cpuinfo(tmp_path, flags):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nflags\t\t: fpu sse2 {flags}\n\nprocessor\t: 1\n")
    return str(path)


@x86_linux
@pytest.mark.parametrize("flags, expected, turned_on", [
    ("avx avx2 fma", "oneDNN (set by tfnmt)", True),                   # AVX2 EPYC
    ("avx2 fma avx512f avx512_vnni avx512_bf16", "oneDNN (TensorFlow's default here)", False),
    ("avx2 fma amx_tile amx_bf16", "oneDNN (TensorFlow's default here)", False),
    ("avx sse4_2", "TensorFlow's default", False),                     # no AVX2
])
def test_onednn_is_turned_on_only_where_tensorflow_leaves_it_off(tmp_path, flags, expected,
                                                                   turned_on):
    environ = {}
    before = cpu_kernels.describe(environ, fake_cpuinfo(tmp_path, flags))
    assert before == ("Eigen (TensorFlow's default here)" if turned_on else expected)
    assert environ == {}  # describe() changes nothing
    assert cpu_kernels.use_onednn(environ, fake_cpuinfo(tmp_path, flags)) == expected
    assert (environ.get("TF_ENABLE_ONEDNN_OPTS") == "1") == turned_on
    # A child (or the re-executed process) reports the same choice; the user's view has none.
    assert cpu_kernels.use_onednn(dict(environ), fake_cpuinfo(tmp_path, flags)) == expected
    assert "TF_ENABLE_ONEDNN_OPTS" not in cpu_kernels.user_environment(environ)


@x86_linux
@pytest.mark.parametrize("given, expected", [("0", "Eigen (TF_ENABLE_ONEDNN_OPTS=0)"),
                                             ("1", "oneDNN (TF_ENABLE_ONEDNN_OPTS=1)")])
def test_the_users_setting_wins(tmp_path, given, expected):
    environ = {"TF_ENABLE_ONEDNN_OPTS": given}
    assert cpu_kernels.use_onednn(environ, fake_cpuinfo(tmp_path, "avx2 fma")) == expected
    assert environ == {"TF_ENABLE_ONEDNN_OPTS": given}
    assert cpu_kernels.user_environment(environ) == environ


def test_unreadable_cpuinfo_leaves_the_choice_to_tensorflow(tmp_path):
    environ = {}
    assert cpu_kernels.use_onednn(environ, str(tmp_path / "missing")) == "TensorFlow's default"
    assert environ == {}


PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
from tfnmt import cpu_kernels
chosen = cpu_kernels.use_onednn()
from tensorflow.python.util import _pywrap_util_port
print(chosen, "|", _pywrap_util_port.IsMklEnabled())
"""


@x86_linux
@pytest.mark.parametrize("given", [None, "0"])
def test_tensorflow_runs_what_use_onednn_reports(given):
    env = cpu_kernels.user_environment()
    env.pop("TF_ENABLE_ONEDNN_OPTS", None)
    if given is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = given
    out = subprocess.run([sys.executable, "-c", PROBE, ROOT], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    chosen, enabled = out.stdout.strip().splitlines()[-1].split(" | ")
    features = cpu_kernels.cpu_flags()
    if given == "0":
        assert (chosen, enabled) == ("Eigen (TF_ENABLE_ONEDNN_OPTS=0)", "False")
    elif {"avx2", "fma"} <= features:   # every CPU tfnmt is measured on
        assert chosen.startswith("oneDNN") and enabled == "True"
    else:
        assert chosen == "TensorFlow's default"


@pytest.mark.parametrize("environ, flags, aborts", [
    ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, "avx2 fma avx512f avx512_bf16", True),     # the AVX2 cap
    ({"ONEDNN_MAX_CPU_ISA": "avx2_vnni"}, "avx2 fma avx512f avx512_vnni", True),
    ({"ONEDNN_MAX_CPU_ISA": "AVX2", "TF_ENABLE_ONEDNN_OPTS": "0"},              # Eigen's kernels
     "avx2 fma avx512f avx512_bf16", False),
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, "avx2 fma avx512f avx512_bf16", False),
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, "avx2 fma avx512f avx512_bf16", False),
    ({"ONEDNN_MAX_CPU_ISA": "AVX2", "TF_ENABLE_ONEDNN_OPTS": "1"}, "avx2 fma", False),  # no AVX-512
    ({}, "avx2 fma avx512f avx512_bf16", False),
])
def test_bf16_abort_reason_names_the_cap(tmp_path, environ, flags, aborts):
    reason = cpu_kernels.bf16_abort_reason(environ, fake_cpuinfo(tmp_path, flags))
    assert (reason is not None) == aborts
    if aborts:
        assert f"ONEDNN_MAX_CPU_ISA={environ['ONEDNN_MAX_CPU_ISA']}" in reason


BF16_PRODUCT = """
import sys
sys.path.insert(0, sys.argv[1])
from tfnmt import cpu_kernels
print(cpu_kernels.bf16_abort_reason() is not None, flush=True)
import tensorflow as tf
a = tf.cast(tf.random.normal([64, 64]), tf.bfloat16)
tf.matmul(a, a).numpy()
print("ran")
"""


@x86_linux
def test_bf16_abort_reason_predicts_what_tensorflow_does():
    # On this machine's CPU, a bfloat16 product in a process started under each environment
    # aborts exactly where bf16_abort_reason says so (on CPUs with AVX-512 under the AVX2 cap).
    env = cpu_kernels.user_environment()
    for name in ("TF_ENABLE_ONEDNN_OPTS", "ONEDNN_MAX_CPU_ISA"):
        env.pop(name, None)
    cases = [{"ONEDNN_MAX_CPU_ISA": "AVX2"}, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
             {"ONEDNN_MAX_CPU_ISA": "AVX2", "TF_ENABLE_ONEDNN_OPTS": "1"}]
    children = [subprocess.Popen([sys.executable, "-c", BF16_PRODUCT, ROOT],
                                 env=dict(env, **case), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for case in cases]
    for case, child in zip(cases, children):
        out, err = child.communicate(timeout=120)
        predicted = out.splitlines()[0]
        assert predicted in ("True", "False"), err[-2000:]
        assert (child.returncode != 0) == (predicted == "True"), (case, err[-2000:])
        if predicted == "False":
            assert out.splitlines()[1] == "ran", err[-2000:]
