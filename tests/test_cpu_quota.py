"""The cores a CPU limit gives (tfnmt/cpu_quota.py), read from cgroup file trees laid out as
the kernel's cgroup v1 and v2 file systems lay them out."""
import pytest

from tfnmt import cpu_quota


def tree(root, files):
    """Writes {relative path: text} under `root` (a stand-in for /sys/fs/cgroup)."""
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A 64-core machine's cgroup mount and /proc/self/cgroup: (root, write(proc, files))."""
    monkeypatch.setattr(cpu_quota, "affinity_cores", lambda: 64)
    root = tmp_path / "cgroup"
    root.mkdir()

    def write(proc, files):
        (tmp_path / "proc_cgroup").write_text(proc)
        tree(root, files)
        return str(tmp_path / "proc_cgroup"), str(root)

    return write


def test_cgroup_v2_takes_the_smallest_limit_on_the_process_path(machine):
    # A Kubernetes pod limited to 2 CPUs, its container unlimited within it; the kubepods
    # slice above both limited to 4.
    where = machine("0::/kubepods/pod1/container\n", {
        "cgroup.controllers": "cpu memory\n",
        "kubepods/cpu.max": "400000 100000\n",
        "kubepods/pod1/cpu.max": "200000 100000\n",
        "kubepods/pod1/container/cpu.max": "max 100000\n"})
    assert cpu_quota.quota_cpus(*where) == 2.0
    assert cpu_quota.usable_cores(*where) == 2


def test_a_container_reads_its_own_cgroup_at_the_mount_root(machine):
    # With its own cgroup namespace the process's path is "/"; without it, a path the container
    # cannot see under its mount: both read the limit at the mount's root. 1.5 CPUs: 2 threads.
    for proc in ("0::/\n", "0::/system.slice/docker-abc.scope\n"):
        where = machine(proc, {"cgroup.controllers": "cpu\n", "cpu.max": "150000 100000\n"})
        assert cpu_quota.quota_cpus(*where) == 1.5
        assert cpu_quota.usable_cores(*where) == 2


def test_a_hybrid_hierarchy_reads_cgroup_v2_where_it_is_mounted(machine):
    # systemd's hybrid layout: v1 controllers under the root, the v2 hierarchy under unified/.
    where = machine("4:memory:/user.slice\n0::/user.slice/job.scope\n", {
        "memory/user.slice/memory.limit_in_bytes": "1073741824\n",
        "unified/cgroup.controllers": "cpu\n",
        "unified/user.slice/job.scope/cpu.max": "300000 100000\n"})
    assert cpu_quota.quota_cpus(*where) == 3.0


def test_cgroup_v1_reads_the_cfs_quota_of_the_cpu_controller(machine):
    where = machine("5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n", {
        "memory/docker/abc/memory.limit_in_bytes": "1073741824\n",
        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"})
    assert cpu_quota.quota_cpus(*where) == 0.5
    assert cpu_quota.usable_cores(*where) == 1  # at least one


@pytest.mark.parametrize("proc, files", [
    ("0::/\n", {"cgroup.controllers": "cpu\n", "cpu.max": "max 100000\n"}),  # no limit
    ("0::/\n", {"cgroup.controllers": "cpu\n"}),  # the root cgroup has no cpu.max
    ("3:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}),
    ("3:cpu:/\n", {"cpu/cpu.cfs_quota_us": "garbage\n"}),
    ("0::/\n", {}),  # no cgroup file system mounted
    ("", {}),
    ("0::/\n", {"cgroup.controllers": "cpu\n", "cpu.max": "6400000 100000\n"}),  # above 64
])
def test_no_readable_limit_below_the_cores_leaves_every_core(machine, proc, files):
    where = machine(proc, files)
    assert cpu_quota.usable_cores(*where) == 64


def test_limit_threads_sets_tensorflows_pools_unless_the_user_did(machine):
    where = machine("0::/\n", {"cgroup.controllers": "cpu\n", "cpu.max": "150000 100000\n"})
    environ = {}
    assert cpu_quota.limit_threads(environ, *where) == (
        "2 per pool (its cgroup's CPU limit of 1.5, on 64 cores)")
    assert environ == {"TF_NUM_INTRAOP_THREADS": "2", "TF_NUM_INTEROP_THREADS": "2",
                       "TFNMT_THREADS_SET": "1"}
    # A process started by this one (a re-executed one, a subprocess) sets them again.
    assert cpu_quota.limit_threads(environ, *where) is not None
    user = {"TF_NUM_INTRAOP_THREADS": "8"}
    assert cpu_quota.limit_threads(user, *where) is None
    assert user == {"TF_NUM_INTRAOP_THREADS": "8"}
    unlimited = machine("0::/\n", {"cpu.max": "max 100000\n"})
    environ = {}
    assert cpu_quota.limit_threads(environ, *unlimited) is None and environ == {}
