"""tfnmt/allocator.py: the one re-exec with a preloaded library, and glibc's tuning, observed
through glibc's own statistics (mallinfo2)."""
import json
import os
import subprocess
import sys

import pytest

from tfnmt import allocator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Prints its pid before and after the call (a re-exec prints "start" twice with the same pid),
# then whether a 96 MiB malloc (larger than glibc's largest mmap threshold, as a batch's logits
# are) was served by mmap (glibc's mallinfo2().hblks counts those).
PROBE = r"""
import ctypes, json, os, sys
sys.path.insert(0, sys.argv[1])
print("start", os.getpid(), flush=True)
from tfnmt import allocator
result = allocator.use_fast_allocator()

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split())]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
before = libc.mallinfo2().hblks
block = libc.malloc(96 << 20)
mmapped = libc.mallinfo2().hblks - before
libc.free(ctypes.c_void_p(block))
print(json.dumps(dict(pid=os.getpid(), result=result, argv=sys.argv[2:], mmapped=mmapped,
                      preload=os.environ.get("LD_PRELOAD", ""))))
"""

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc, /proc")


def run_probe(mode, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFNMT_MALLOC")}
    env.pop("LD_PRELOAD", None)
    env["TFNMT_MALLOC"] = mode
    out = subprocess.run([sys.executable, "-u", "-c", PROBE, ROOT, *args], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    return [line for line in lines if line.startswith("start")], json.loads(lines[-1])


@linux_only
def test_glibc_tuning_keeps_large_blocks_in_the_heap():
    starts, system = run_probe("system")
    assert system["result"] == "system" and system["mmapped"] == 1   # glibc's default: mmap
    starts, tuned = run_probe("glibc")
    assert tuned["result"] == "glibc (tuned)" and tuned["mmapped"] == 0
    assert len(starts) == 1


@linux_only
def test_preload_re_executes_once_with_the_same_arguments():
    # libc itself stands in for an allocator library: preloading it is harmless, and since it
    # is no tcmalloc the re-executed process must neither loop nor fail, but tune glibc.
    libc = next(line.split()[-1] for line in open("/proc/self/maps") if "libc.so" in line)
    starts, child = run_probe(libc, "a", "--flag=1")
    assert len(starts) == 2 and {s.split()[1] for s in starts} == {str(child["pid"])}
    assert child["argv"] == ["a", "--flag=1"]
    assert child["preload"].split(":")[0] == libc
    assert child["result"] == "glibc (tuned)" and child["mmapped"] == 0


@pytest.mark.parametrize("mode", ["fast", "/no/such/libtcmalloc.so"])
def test_bad_setting_is_one_clear_error(monkeypatch, mode):
    monkeypatch.setenv("TFNMT_MALLOC", mode)
    with pytest.raises(allocator.AllocatorError, match="TFNMT_MALLOC"):
        allocator.use_fast_allocator()
