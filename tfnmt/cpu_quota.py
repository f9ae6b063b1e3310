"""The CPU cores a process can use: those it may run on, fewer where its cgroup caps its CPU time.

A container's CPU limit (`docker run --cpus=2`, a Kubernetes `limits.cpu`) is a CFS quota: the
process may still run on every core of the machine, only for a share of each period. TensorFlow
sizes its thread pools by the cores it may run on, so in a container limited to 2 CPUs on a
64-core machine it runs 64 threads per op, which the quota then throttles. Measured on a
2-core Zen 4 EPYC (`small`, float32, oneDNN, 40 updates; a cgroup v1 quota of one CPU): 2,236
target tokens/s with one thread per pool, 1,945 with TensorFlow's default of two, 1,667 with
sixteen (as on a 16-core machine); under no limit, two threads ran 3,778 and sixteen 3,161.

`limit_threads()` (every entry point calls it before TensorFlow loads) sets
TF_NUM_INTRAOP_THREADS and TF_NUM_INTEROP_THREADS, which TensorFlow reads when it sizes its
pools, to the cores the quota gives, where that is fewer than the cores the process may run on
and the environment sets neither.
"""
import math
import os

THREAD_VARIABLES = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")
# Set beside THREAD_VARIABLES when tfnmt set them (not the user): a program that sizes its pools
# itself (decoding_threads) may still do so.
SET_BY_TFNMT = "TFNMT_THREADS_SET"
PROC_CGROUP = "/proc/self/cgroup"
CGROUP_ROOT = "/sys/fs/cgroup"


def _read(path, split=str.split):
    try:
        with open(path) as f:
            return split(f.read())
    except (OSError, UnicodeDecodeError):
        return None


def _v2_limit(directory):
    """CPUs' worth of time per period that cgroup v2's cpu.max in `directory` allows, or None."""
    fields = _read(os.path.join(directory, "cpu.max"))
    try:
        return int(fields[0]) / int(fields[1]) if fields and fields[0] != "max" else None
    except (ValueError, IndexError, ZeroDivisionError):
        return None


def _v1_limit(directory):
    """CPUs' worth of time per period that cgroup v1's CFS quota in `directory` allows, or
    None (-1: no quota)."""
    quota = _read(os.path.join(directory, "cpu.cfs_quota_us"))
    period = _read(os.path.join(directory, "cpu.cfs_period_us"))
    try:
        quota, period = int(quota[0]), int(period[0])
    except (TypeError, ValueError, IndexError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def _ancestors(mount, path):
    """`mount` joined with the cgroup `path` and each of its parents, up to `mount` itself (in a
    container with its own cgroup namespace, or its own view of the file system, the path read
    from /proc may not exist under the mount: the mount's root is then its cgroup)."""
    parts = [p for p in path.split("/") if p]
    directories = [os.path.join(mount, *parts[:n]) for n in range(len(parts), 0, -1)]
    return [d for d in directories if os.path.isdir(d)] + [mount]


def quota_cpus(proc_cgroup=PROC_CGROUP, root=CGROUP_ROOT):
    """The CPUs' worth of time per period the process's cgroups allow (the smallest quota on its
    cgroup's path, cgroup v2 or v1), or None where none is set or none can be read.

    Args:
      proc_cgroup: the process's /proc/<pid>/cgroup.
      root: where the cgroup file systems are mounted.
    """
    lines = _read(proc_cgroup, str.splitlines) or []
    limits = []
    for line in lines:  # "0::/path" (v2), "4:cpu,cpuacct:/path" (v1)
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":
            for mount in (root, os.path.join(root, "unified")):
                if os.path.exists(os.path.join(mount, "cgroup.controllers")):
                    limits += [_v2_limit(d) for d in _ancestors(mount, path)]
                    break
        elif "cpu" in controllers.split(","):
            for name in (controllers, "cpu", "cpu,cpuacct"):
                mount = os.path.join(root, name)
                if os.path.isdir(mount):
                    limits += [_v1_limit(d) for d in _ancestors(mount, path)]
                    break
    limits = [limit for limit in limits if limit]
    return min(limits) if limits else None


def affinity_cores():
    """The cores the process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def usable_cores(proc_cgroup=PROC_CGROUP, root=CGROUP_ROOT):
    """The cores the process may run on, capped at its cgroup's CPU quota rounded up (a limit
    of 1.5 CPUs: 2)."""
    return _capped(affinity_cores(), quota_cpus(proc_cgroup, root))


def _capped(cores, quota):
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))


def limit_threads(environ=os.environ, proc_cgroup=PROC_CGROUP, root=CGROUP_ROOT):
    """Sets TensorFlow's thread pools to the cores a CPU quota gives (THREAD_VARIABLES, before
    TensorFlow loads), where that is fewer than the cores the process may run on and the user
    set neither variable.

    Returns:
      A few words for a program's log ("2 per pool (its cgroup's CPU limit of 1.5, on 64
      cores)"), or None where nothing was set.
    """
    if any(environ.get(name) for name in THREAD_VARIABLES) and not environ.get(SET_BY_TFNMT):
        return None
    cores, quota = affinity_cores(), quota_cpus(proc_cgroup, root)
    usable = _capped(cores, quota)
    if usable >= cores:
        return None
    for name in THREAD_VARIABLES:
        environ[name] = str(usable)
    environ[SET_BY_TFNMT] = "1"
    return f"{usable} per pool (its cgroup's CPU limit of {quota:g}, on {cores} cores)"
