"""A cap on the process's address space (`ulimit -v`, RLIMIT_AS; Grid Engine's h_vmem sets it
for every job), which TensorFlow reaches long before its memory runs out.

TensorFlow maps far more address space than it keeps resident: its libraries, a stack for
each of its threads and the allocator's per-thread arenas. On the 2-core Zen 4 EPYC, training
`tiny` mapped 4.4 GiB with 1.2 GiB resident, `small` 4.7 GiB with 1.7 GiB at its peak (more
threads on more cores map more). A process that reaches the cap does not raise a MemoryError:
TensorFlow aborts with a stack trace (`pthread_create() failed` in one run, `dnnl::error` in
another), here under a cap of 3.8 GiB once `tiny` had trained its 5 updates.
"""
import resource

# Below this cap a run is warned at its start.
LOW_CAP = 8 << 30


def warning():
    """What to tell a user whose address-space cap is below LOW_CAP, or None."""
    try:
        cap, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (OSError, ValueError):
        return None
    if cap == resource.RLIM_INFINITY or cap >= LOW_CAP:
        return None
    return (f"warning: this process may map {cap / (1 << 30):.1f} GiB of address space "
            "(`ulimit -v`; a batch system's h_vmem); TensorFlow maps several times the "
            "memory it uses (4.7 GiB for training `small` on 2 cores) and aborts with a stack "
            "trace where it reaches the cap: ask for 8 GiB or more, or lift the cap "
            "(`ulimit -v unlimited`)")
