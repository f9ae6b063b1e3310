"""The cluster a multi-worker run belongs to, from TF_CONFIG, read without TensorFlow: train.py
refuses a TF_CONFIG that cannot place this process in a cluster in one line, before TensorFlow
loads (TensorFlow would fail later with a traceback, or wait for workers that never come).

    TF_CONFIG='{"cluster": {"worker": ["host1:12345", "host2:12345"]},
                "task": {"type": "worker", "index": 0}}'
"""
import errno
import json
import os
import re
import socket

# The cluster jobs whose processes train (a "chief", if any, is the first of them).
TRAINING_JOBS = ("chief", "worker")


class ClusterConfigError(ValueError):
    """TF_CONFIG does not describe this process's place in a training cluster."""


def read_tf_config(environ=None):
    """TF_CONFIG parsed.

    Args:
      environ: the environment (default os.environ).

    Returns:
      A dict; {} when TF_CONFIG is unset or empty.

    Raises:
      ClusterConfigError: TF_CONFIG is not a JSON object.
    """
    text = (os.environ if environ is None else environ).get("TF_CONFIG", "").strip()
    if not text:
        return {}
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ClusterConfigError(f"TF_CONFIG is not JSON ({error})") from None
    if not isinstance(config, dict):
        raise ClusterConfigError("TF_CONFIG must be a JSON object with \"cluster\" and \"task\"")
    return config


def training_processes(config):
    """The number of processes that train in the config's cluster (its chief and workers; 0
    without a cluster)."""
    cluster = config.get("cluster")
    if not isinstance(cluster, dict):
        return 0
    return sum(len(cluster[job]) for job in TRAINING_JOBS if isinstance(cluster.get(job), list))


def check_training_task(config):
    """Raises ClusterConfigError unless `config` (a parsed TF_CONFIG) names a cluster with a
    training job (each job a list of addresses) and this process's task among its tasks.

    Args:
      config: what `read_tf_config` returns.
    """
    example = ('e.g. {"cluster": {"worker": ["host1:12345", "host2:12345"]}, '
               '"task": {"type": "worker", "index": 0}}')
    if not config:
        raise ClusterConfigError(f"--strategy=multi_worker needs TF_CONFIG describing the "
                                 f"cluster and this process's task in it, {example}")
    cluster = config.get("cluster")
    if not isinstance(cluster, dict):
        raise ClusterConfigError(f"TF_CONFIG needs a \"cluster\", {example}")
    for job, addresses in cluster.items():
        if not isinstance(addresses, list) or not all(
                isinstance(a, str) and re.fullmatch(r".+:\d+", a) for a in addresses):
            raise ClusterConfigError(f"TF_CONFIG's cluster job {job!r} must be a list of "
                                     f"\"host:port\" addresses, got {addresses!r}")
    if not training_processes(config):
        raise ClusterConfigError(f"TF_CONFIG's \"cluster\" names no \"worker\" (or \"chief\") "
                                 f"addresses, {example}")
    if len(cluster.get("chief", [])) > 1:
        raise ClusterConfigError("TF_CONFIG's cluster has more than one \"chief\"")
    task = config.get("task")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise ClusterConfigError("TF_CONFIG needs this process's \"task\", its \"type\" and "
                                 "\"index\" in the cluster, e.g. {\"type\": \"worker\", "
                                 "\"index\": 0}")
    job, index = task["type"], task["index"]
    if job not in TRAINING_JOBS or not cluster.get(job):
        named = ", ".join(repr(j) for j in TRAINING_JOBS if cluster.get(j))
        raise ClusterConfigError(f"TF_CONFIG's task type {job!r} is not one of the cluster's "
                                 f"training jobs ({named})")
    count = len(cluster[job])
    # TensorFlow reads the index as int(index): 0 and "0" alike.
    if isinstance(index, bool) or not str(index).isdigit() or int(index) >= count:
        raise ClusterConfigError(f"TF_CONFIG's task index {index!r} is not a position in its "
                                 f"cluster's {job!r} list of {count} (0 to {count - 1})")


def check_own_port_free(config):
    """Raises ClusterConfigError where this process's port (its address in `config`, which
    `check_training_task` passed) is taken on this machine: TensorFlow's server would fail to
    start with a traceback ("Could not start gRPC server")."""
    port = int(own_address(config).rsplit(":", 1)[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server binds
        try:
            probe.bind(("", port))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                return  # TensorFlow says what else is wrong
            raise ClusterConfigError(port_in_use(config)) from None


def own_address(config):
    """This process's "host:port" in `config` (which `check_training_task` passed)."""
    return config["cluster"][config["task"]["type"]][int(config["task"]["index"])]


def port_in_use(config):
    """The refusal of a process whose port another process on this machine has taken."""
    task, address = config["task"], own_address(config)
    return (f"TF_CONFIG gives this process ({task['type']} {task['index']}) the address "
            f"{address}, and its port is in use on this machine: by another program, by "
            "another task of the cluster given the same address, or by a worker of an earlier "
            "run still running (a cluster worker outlives SIGTERM); stop it, or give another "
            "port")
