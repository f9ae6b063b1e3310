"""The entry points' TensorFlow start: the C++ lines TF_CPP_MIN_LOG_LEVEL cannot hide, filtered."""
import glob
import os
import re
import subprocess
import sys

import pytest

from helpers import ROOT
from tfnmt.tensorflow_start import BANNER, NVIDIA_DEVICE_FILES, keep_line

INFO = "I0000 00:00:1796184769.572377   30206 port.cc:153] oneDNN custom operations are on."
WARNING = "W1128 10:11:12.000001   77 device.cc:9] a warning"
ERROR = "E0000 00:00:1796184770.442611   30206 some_op.cc:52] a real error"
NO_DRIVER = ("E0000 00:00:1796184770.442611   30206 cuda_platform.cc:52] failed call to cuInit: "
             "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)")
FATAL = "F0000 00:00:1796184770.442611   30206 kernel.cc:1] Check failed: x"
PLAIN = "Traceback (most recent call last):"


@pytest.mark.parametrize("level, nvidia_device, shown", [
    # TF_CPP_MIN_LOG_LEVEL's table (0: all, 1: no INFO, 2: no WARNING, 3: no ERROR); fatal and
    # other lines always; the cuInit error only at 0 or where an NVIDIA device exists.
    (0, False, [BANNER, INFO, WARNING, ERROR, NO_DRIVER, FATAL, PLAIN]),
    (1, False, [WARNING, ERROR, FATAL, PLAIN]),
    (2, False, [ERROR, FATAL, PLAIN]),
    (3, False, [FATAL, PLAIN]),
    (2, True, [ERROR, NO_DRIVER, FATAL, PLAIN]),
    (3, True, [FATAL, PLAIN]),
])
def test_lines_are_kept_as_the_log_level_says(level, nvidia_device, shown):
    lines = [BANNER, INFO, WARNING, ERROR, NO_DRIVER, FATAL, PLAIN]
    assert [line for line in lines if keep_line(line, level, nvidia_device)] == shown


def run(script, **env):
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, **env))


def test_tensorflow_starts_without_the_lines_its_log_level_hides():
    # The same start (TensorFlow imported through Keras, a first op) with and without the
    # filter, at the entry points' TF_CPP_MIN_LOG_LEVEL=2; a probe for TensorFlow before
    # (tensorflow_datasets makes one, as evaluate.py reads a TFDS dataset's split) does
    # not import it, and leaves the import to come filtered.
    script = ("import importlib.util, os\n"
              "if os.environ['FILTER'] == '1':\n"
              "    from tfnmt import tensorflow_start; tensorflow_start.install()\n"
              "assert importlib.util.find_spec('tensorflow') is not None\n"
              "import keras, tensorflow as tf, tensorflow_text\n"
              "print(type(tf.__loader__).__name__, type(tf.__spec__.loader).__name__)\n"
              "print(float(tf.reduce_sum(tf.ones([3]))))\n")
    plain = run(script, TF_CPP_MIN_LOG_LEVEL="2", FILTER="0")
    filtered = run(script, TF_CPP_MIN_LOG_LEVEL="2", FILTER="1")
    assert plain.returncode == filtered.returncode == 0, filtered.stderr[-3000:]
    assert plain.stdout == filtered.stdout == "SourceFileLoader SourceFileLoader\n3.0\n"
    assert BANNER in plain.stderr.splitlines()  # what there is to filter
    # What the filter takes away: the banner, TensorFlow's INFO and WARNING lines (which the
    # level hides everywhere else), and the no-driver error where no NVIDIA device exists.
    no_device = not glob.glob(NVIDIA_DEVICE_FILES)
    expected = [line for line in plain.stderr.splitlines()
                if line != BANNER and not re.match(r"^[IW]\d{4} ", line)
                and not ("failed call to cuInit" in line and no_device)]
    assert untimed(filtered.stderr.splitlines()) == untimed(expected)


def untimed(lines):
    """Log lines without their date, time and thread id, which differ between processes."""
    return [re.sub(r"^([IWEF])\d{4} [\d:.]+ +\d+ ", r"\1 ", line) for line in lines]


def test_what_is_written_before_an_abort_reaches_stderr():
    # The filter is its own process: lines written just before the process dies still pass.
    script = ("import os\n"
              "from tfnmt.tensorflow_start import filtered_stderr\n"
              "with filtered_stderr(level=2):\n"
              f"    os.write(2, {INFO!r}.encode() + b'\\n')\n"
              f"    os.write(2, {FATAL!r}.encode() + b'\\n' + b'no newline at the end')\n"
              "    os.abort()\n")
    result = run(script)
    assert result.returncode == -6
    assert result.stderr.splitlines() == [FATAL, "no newline at the end"]


def test_after_the_start_stderr_passes_everything():
    # After the start, stderr is the process's own again: a later log line of any level and
    # the program's own messages are written as they are, in order.
    script = ("import os, sys\n"
              "from tfnmt import tensorflow_start\n"
              "tensorflow_start.install()\n"
              "import tensorflow as tf\n"
              f"os.write(2, {INFO!r}.encode() + b'\\n')\n"
              "print('after', file=sys.stderr)\n")
    result = run(script, TF_CPP_MIN_LOG_LEVEL="2")
    assert result.returncode == 0, result.stderr[-3000:]
    tail = [line for line in result.stderr.splitlines()
            if not ("failed call to cuInit" in line and glob.glob(NVIDIA_DEVICE_FILES))]
    assert tail == [INFO, "after"]


def test_a_process_without_stderr_starts_tensorflow_unfiltered():
    # File descriptor 2 closed (a daemon's `2>&-`): nothing to filter, and the import works.
    script = ("from tfnmt import tensorflow_start\n"
              "tensorflow_start.install()\n"
              "import tensorflow as tf\n"
              "print(float(tf.reduce_sum(tf.ones([2]))))\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, preexec_fn=lambda: os.close(2),
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert (result.returncode, result.stdout) == (0, "2.0\n")
