"""The C memory allocator under TensorFlow's CPU kernels.

Every training or search step allocates and frees hundreds of tensors of a few hundred KiB to
tens of MiB (a batch's logits) from several threads. glibc's malloc serves blocks above its
(dynamic) mmap threshold with fresh `mmap`s, gives freed memory back to the kernel and refills
it page fault by page fault, so a third of the CPU time of a float32 training run can go to the
kernel. tcmalloc keeps that memory in per-thread caches; glibc can be told to keep it too: no
mmap for single blocks at all (the threshold cannot exceed 32 MiB, and a logits tensor is
larger), and a high trim threshold so that freed heap stays mapped.

`use_fast_allocator()` (called by every entry point before TensorFlow is imported) picks one, as
told by the environment variable TFNMT_MALLOC:

  auto (default)  re-execute the process once with tcmalloc preloaded when the system has it
                  (Debian/Ubuntu: `apt install libtcmalloc-minimal4`), else tune glibc in place
  tcmalloc        the same, but fail in one line when tcmalloc cannot be found
  glibc           tune glibc only
  system          leave the allocator alone
  /path/lib.so    preload this library (a tcmalloc or jemalloc build) instead of searching

Only Linux is affected; elsewhere this is a no-op.
"""
import ctypes
import ctypes.util
import os
import sys

ENV = "TFNMT_MALLOC"
# Set in the re-executed process: says a preload was already attempted, so it never loops.
REEXEC_MARK = "TFNMT_MALLOC_PRELOADED"
_TCMALLOC_NAMES = ("tcmalloc_minimal", "tcmalloc")
LIBRARY_NAMES = ("tcmalloc", "jemalloc", "mimalloc")  # what a loaded allocator's file is called
_TCMALLOC_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                  "/usr/lib", "/usr/local/lib")

# mallopt parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_MAX = -4
# Every block from the heap (mmap only where glibc must: a thread arena's block larger than its
# 64 MiB heap, or a failed sbrk), and up to 1 GiB of freed heap kept instead of returned to the
# kernel after every step.
GLIBC_SETTINGS = {_M_MMAP_MAX: 0, _M_TRIM_THRESHOLD: 1 << 30, _M_TOP_PAD: 64 << 20}


class AllocatorError(RuntimeError):
    """TFNMT_MALLOC asks for something this machine cannot do."""


def find_tcmalloc():
    """Returns the path (or loader name) of a tcmalloc shared library, or None."""
    for name in _TCMALLOC_NAMES:
        for directory in _TCMALLOC_DIRS:
            for version in (".4", ""):
                path = os.path.join(directory, f"lib{name}.so{version}")
                if os.path.exists(path):
                    return path
        found = ctypes.util.find_library(name)
        if found:
            return found
    return None


def loaded_allocator():
    """The path of a tcmalloc/jemalloc/mimalloc library mapped into this process, or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if any(name in os.path.basename(path) for name in LIBRARY_NAMES):
                    return path
    except OSError:
        pass
    return None


def tune_glibc():
    """Applies GLIBC_SETTINGS to this process's glibc malloc; returns True when all took."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return all(libc.mallopt(param, value) == 1 for param, value in GLIBC_SETTINGS.items())


def _reexec_with_preload(library):
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(filter(None, [library, env.get("LD_PRELOAD")]))
    env[REEXEC_MARK] = library
    # tcmalloc reports every allocation above 1 GiB on stderr; the decoding caches of large
    # batches are that big by design.
    env.setdefault("TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD", str(1 << 40))
    sys.stdout.flush()
    sys.stderr.flush()
    # orig_argv keeps the interpreter's own options (-m, -X, -u) as well as the script's.
    os.execve(sys.executable, [sys.executable] + sys.orig_argv[1:], env)


def use_fast_allocator():
    """Makes this process use the allocator TFNMT_MALLOC asks for (see the module docstring).

    May not return: the first call re-executes the process with the library preloaded.
    Returns what the process uses: "tcmalloc"/the preloaded path, "glibc (tuned)" or "system".
    Raises:
      AllocatorError: TFNMT_MALLOC is unknown, or names a library that does not exist, or is
        `tcmalloc` and none is installed.
    """
    mode = os.environ.get(ENV, "auto").strip() or "auto"
    if mode not in ("auto", "tcmalloc", "glibc", "system") and os.path.sep not in mode:
        raise AllocatorError(f"{ENV}={mode!r}: use auto, tcmalloc, glibc, system or a library path")
    if mode == "system" or not sys.platform.startswith("linux"):
        return "system"
    loaded = loaded_allocator()
    if loaded:
        return loaded
    if mode != "glibc" and not os.environ.get(REEXEC_MARK):  # never more than one re-exec
        library = mode if os.path.sep in mode else find_tcmalloc()
        if library is None and mode == "tcmalloc":
            raise AllocatorError(f"{ENV}=tcmalloc: no libtcmalloc found (Debian/Ubuntu: "
                                 "apt install libtcmalloc-minimal4)")
        if library is not None and os.path.sep in mode and not os.path.exists(library):
            raise AllocatorError(f"{ENV}={mode}: no such file")
        if library is not None:
            _reexec_with_preload(library)
    return "glibc (tuned)" if tune_glibc() else "system"
