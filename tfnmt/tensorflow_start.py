"""TensorFlow's start in the entry points, without the C++ lines TF_CPP_MIN_LOG_LEVEL cannot hide.

Importing TensorFlow prints lines from its C++ libraries before their (absl) logging is set up,
so TF_CPP_MIN_LOG_LEVEL does not filter them: a banner, "WARNING: All log messages before
absl::InitializeLog() is called are written to STDERR", and oneDNN's and CUDA's INFO notes, once
per library that logs; then, when TensorFlow first looks for devices on a machine without
NVIDIA's driver, "E... cuda_platform.cc:52] failed call to cuInit: ... UNKNOWN ERROR (303)".

`install()` (the entry points call it first) makes the process's first `import tensorflow`,
wherever it happens, run with stderr (file descriptor 2) sent through a filter, and list the
devices before stderr is restored. The filter keeps what TF_CPP_MIN_LOG_LEVEL keeps (0: every
line, 1: no INFO, 2: no WARNING either (the entry points' default), 3: no ERROR either), and
from 1 up drops the banner and, where the machine has no NVIDIA device file (no driver: the
error only says so), the cuInit error. Fatal lines and any line that is not such a log line pass
as they are. The filter is a forked process that writes to the real stderr as lines come, so
what was printed reaches it even if the import aborts the process.
"""
import contextlib
import glob
import importlib.machinery
import os
import re
import signal
import sys

BANNER = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
# absl's and glog's prefix: severity letter, MMDD, time (before absl's logging is set up: hours and
# minutes 0, seconds since 1970), thread id, file:line].
_LOG_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^\]]*\] ")
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}
_NO_DRIVER_ERROR = "failed call to cuInit"
# NVIDIA's driver's device files (serving.GPU_DEVICE_FILES adds AMD's).
NVIDIA_DEVICE_FILES = "/dev/nvidia[0-9]*"


def min_log_level(environ=os.environ):
    """TF_CPP_MIN_LOG_LEVEL as an int from 0 to 3 (0 when unset or not a number)."""
    try:
        return min(max(int(environ.get("TF_CPP_MIN_LOG_LEVEL", "0")), 0), 3)
    except ValueError:
        return 0


def keep_line(line, level, nvidia_device):
    """Whether a line TensorFlow's libraries printed at its start is shown.

    Args:
      line: one line, without its newline.
      level: TF_CPP_MIN_LOG_LEVEL (0-3).
      nvidia_device: the machine has an NVIDIA device file.

    Returns:
      True to write it to stderr.
    """
    if line.rstrip() == BANNER:
        return level == 0
    match = _LOG_LINE.match(line)
    if not match:
        return True
    severity = _SEVERITY[match.group(1)]
    if severity == 3:
        return True
    if _NO_DRIVER_ERROR in line and not nvidia_device:
        return level == 0
    return severity >= level


def _forward(read_fd, write_fd, level, nvidia_device):
    """The filter process's loop: the lines kept, from read_fd to write_fd, until EOF (reading on
    where stderr no longer takes them, so that the writers never block)."""
    pending = b""
    while True:
        chunk = os.read(read_fd, 65536)
        if not chunk:
            lines, pending = [pending], b""
        else:
            *lines, pending = (pending + chunk).split(b"\n")
        for raw in lines:
            if raw and keep_line(raw.decode("utf-8", "replace"), level, nvidia_device):
                try:
                    os.write(write_fd, raw + b"\n")
                except OSError:
                    pass
        if not chunk:
            return


@contextlib.contextmanager
def filtered_stderr(level=None):
    """Within it, what the process writes to file descriptor 2 passes `keep_line` first.

    Args:
      level: the TF_CPP_MIN_LOG_LEVEL to apply (default: the environment's).
    """
    level = min_log_level() if level is None else level
    nvidia_device = bool(glob.glob(NVIDIA_DEVICE_FILES))
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    try:
        stderr = os.dup(2)
    except OSError:  # no stderr to filter
        yield
        return
    opened = [stderr]
    try:
        read_fd, write_fd = os.pipe()
        opened += [read_fd, write_fd]
        child = os.fork()
    except OSError:  # out of processes or descriptors: unfiltered
        for fd in opened:
            os.close(fd)
        yield
        return
    if child == 0:
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
            os.close(write_fd)
            _forward(read_fd, stderr, level, nvidia_device)
        finally:
            os._exit(0)
    os.close(read_fd)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    try:
        yield
    finally:
        if sys.stderr is not None:
            sys.stderr.flush()
        os.dup2(stderr, 2)  # the pipe's only writer is gone: the filter reads EOF and exits
        os.close(stderr)
        os.waitpid(child, 0)


class _FilteredLoader:
    """Runs tensorflow/__init__.py, then lists the devices, within `filtered_stderr`."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        _remove_finder()
        module.__spec__.loader = module.__loader__ = self.loader
        with filtered_stderr():
            self.loader.exec_module(module)
            module.config.list_physical_devices()


class _TensorFlowFinder:
    """A sys.meta_path entry that hands the first `import tensorflow` to `_FilteredLoader`. It
    stays until the import runs: a probe (`importlib.util.find_spec("tensorflow")`, as
    tensorflow_datasets makes one) looks up the spec without importing."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _FilteredLoader(spec.loader)
        return spec


def _remove_finder():
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _TensorFlowFinder)]


def install():
    """Filters the first `import tensorflow` of this process (see the module docstring); a
    no-op where TensorFlow is imported already or the platform cannot fork."""
    if "tensorflow" in sys.modules or not hasattr(os, "fork") \
            or any(isinstance(f, _TensorFlowFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _TensorFlowFinder())
