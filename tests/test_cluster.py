"""TF_CONFIG, read and checked without TensorFlow (tfnmt/training/cluster.py), train.py's
refusal of one that cannot place the process in a training cluster, the settings and
directories a cluster's workers compare with the chief's, and the precision `auto` agrees on
(tfnmt/training/cluster_sync.py)."""
import json
import os
import types

import pytest

from tfnmt.training import cluster

TWO_WORKERS = {"worker": ["host1:12345", "host2:12345"]}


def test_tf_config_is_read_as_json():
    assert cluster.read_tf_config({}) == {} and cluster.read_tf_config({"TF_CONFIG": " "}) == {}
    config = {"cluster": TWO_WORKERS, "task": {"type": "worker", "index": 1}}
    assert cluster.read_tf_config({"TF_CONFIG": json.dumps(config)}) == config
    with pytest.raises(cluster.ClusterConfigError, match="TF_CONFIG is not JSON"):
        cluster.read_tf_config({"TF_CONFIG": "{'cluster': {}}"})  # Python, not JSON
    with pytest.raises(cluster.ClusterConfigError, match="must be a JSON object"):
        cluster.read_tf_config({"TF_CONFIG": '["host1:12345"]'})


def test_training_processes_count_the_chief_and_the_workers():
    assert cluster.training_processes({}) == 0
    assert cluster.training_processes({"cluster": TWO_WORKERS}) == 2
    assert cluster.training_processes({"cluster": dict(TWO_WORKERS, chief=["c:1"],
                                                       evaluator=["e:1"])}) == 3
    assert cluster.training_processes({"cluster": {"worker": "host1:12345"}}) == 0


@pytest.mark.parametrize("config", [
    {"cluster": TWO_WORKERS, "task": {"type": "worker", "index": 0}},
    {"cluster": TWO_WORKERS, "task": {"type": "worker", "index": "1"}},  # TF takes int("1")
    {"cluster": dict(TWO_WORKERS, chief=["c:1"]), "task": {"type": "chief", "index": 0}},
    {"cluster": {"worker": ["localhost:2222"]}, "task": {"type": "worker", "index": 0}},
])
def test_a_task_in_its_cluster_passes(config):
    cluster.check_training_task(config)


@pytest.mark.parametrize("config, message", [
    ({}, "--strategy=multi_worker needs TF_CONFIG describing the cluster and this process's "
         "task in it, e.g."),
    ({"task": {"type": "worker", "index": 0}}, 'TF_CONFIG needs a "cluster", e.g.'),
    ({"cluster": {"worker": "host1:12345"}, "task": {"type": "worker", "index": 0}},
     "TF_CONFIG's cluster job 'worker' must be a list of \"host:port\" addresses, got "
     "'host1:12345'"),
    ({"cluster": {"worker": ["host1:12345", 7]}, "task": {"type": "worker", "index": 0}},
     "TF_CONFIG's cluster job 'worker' must be a list"),
    ({"cluster": {"worker": ["host1:12345", "host2"]}, "task": {"type": "worker", "index": 0}},
     "TF_CONFIG's cluster job 'worker' must be a list of \"host:port\" addresses, got "
     "['host1:12345', 'host2']"),
    ({"cluster": {"ps": ["p:1"]}, "task": {"type": "ps", "index": 0}},
     "TF_CONFIG's \"cluster\" names no \"worker\" (or \"chief\") addresses"),
    ({"cluster": dict(TWO_WORKERS, chief=["c:1", "c:2"]), "task": {"type": "chief", "index": 0}},
     "more than one \"chief\""),
    ({"cluster": TWO_WORKERS}, "TF_CONFIG needs this process's \"task\""),
    ({"cluster": TWO_WORKERS, "task": {"type": "worker"}}, "TF_CONFIG needs this process's"),
    ({"cluster": dict(TWO_WORKERS, ps=["p:1"]), "task": {"type": "ps", "index": 0}},
     "TF_CONFIG's task type 'ps' is not one of the cluster's training jobs ('worker')"),
    ({"cluster": TWO_WORKERS, "task": {"type": "chief", "index": 0}},
     "task type 'chief' is not one of the cluster's training jobs ('worker')"),
    ({"cluster": TWO_WORKERS, "task": {"type": "worker", "index": 2}},
     "TF_CONFIG's task index 2 is not a position in its cluster's 'worker' list of 2 (0 to 1)"),
    ({"cluster": TWO_WORKERS, "task": {"type": "worker", "index": -1}}, "task index -1 is not"),
    ({"cluster": TWO_WORKERS, "task": {"type": "worker", "index": True}}, "task index True"),
])
def test_a_config_that_cannot_place_the_task_is_refused(config, message):
    with pytest.raises(cluster.ClusterConfigError) as error:
        cluster.check_training_task(config)
    assert message in str(error.value)


@pytest.mark.parametrize("strategy, tf_config, flags, message", [
    ("multi_worker", None, [], "train.py: --strategy=multi_worker needs TF_CONFIG describing "
                                "the cluster"),
    ("multi_worker", "worker=host1:12345", [], "train.py: TF_CONFIG is not JSON"),
    ("multi_worker", {"cluster": TWO_WORKERS}, [], "train.py: TF_CONFIG needs this process's "
                                                   "\"task\""),
    # auto with a cluster of several processes is a multi-worker run, decided before TensorFlow
    # loads: its workers plan no time budget each (they must agree on the number of updates).
    ("auto", {"cluster": TWO_WORKERS, "task": {"type": "worker", "index": 0}},
     ["--train_minutes=5"], "train.py: --train_minutes plans on one machine; the workers of "
                            "a cluster need --train_steps"),
    ("auto", {"cluster": TWO_WORKERS, "task": {"type": "worker", "index": 5}}, [],
     "train.py: TF_CONFIG's task index 5 is not a position"),
    # A strategy of one process where TF_CONFIG names a cluster (as a Kubernetes TFJob sets it
    # in every pod): each process trained a model of its own.
    ("mirrored", {"cluster": dict(TWO_WORKERS, chief=["host0:1"]),
                  "task": {"type": "worker", "index": 1}}, [],
     "train.py: --strategy=mirrored trains in this process alone, and TF_CONFIG names a cluster "
     "of 3 training processes: give --strategy=multi_worker (or auto) to train on the cluster, "
     "or unset TF_CONFIG"),
    ("one_device", {"cluster": TWO_WORKERS, "task": {"type": "worker", "index": 0}}, [],
     "train.py: --strategy=one_device trains in this process alone, and TF_CONFIG names a "
     "cluster of 2"),
])
def test_train_py_refuses_a_cluster_it_cannot_join_before_tensorflow_loads(
        strategy, tf_config, flags, message, tmp_path):
    # Without these checks TensorFlow raised a traceback at the strategy's creation, or (auto)
    # each worker planned its own number of updates.
    from helpers import imported_modules, python

    environment = {"PYTHONPROFILEIMPORTTIME": "1", "TF_CONFIG": "" if tf_config is None else
                   tf_config if isinstance(tf_config, str) else json.dumps(tf_config)}
    result = python("train.py", f"--model_dir={tmp_path / 'run'}", f"--strategy={strategy}",
                    *flags, env=environment, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(message), result.stderr[-2000:]
    assert "tensorflow" not in imported_modules(result.stderr)
    assert not (tmp_path / "run").exists()


def test_train_py_refuses_a_port_in_use_before_tensorflow_loads(tmp_path):
    # A worker of an earlier run still running (cluster workers outlive SIGTERM) holds the
    # port: TensorFlow failed with a traceback ("Could not start gRPC server").
    import socket

    from helpers import imported_modules, python

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        tf_config = {"cluster": {"worker": [address, "127.0.0.1:1"]},
                     "task": {"type": "worker", "index": 0}}
        result = python("train.py", f"--model_dir={tmp_path / 'run'}", "--strategy=multi_worker",
                        env={"PYTHONPROFILEIMPORTTIME": "1", "TF_CONFIG": json.dumps(tf_config)},
                        timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"train.py: TF_CONFIG gives this process (worker 0) the address {address}, and its port "
        "is in use on this machine: by another program, by another task of the cluster given "
        "the same address, or by a worker of an earlier run still running (a cluster worker "
        "outlives SIGTERM); stop it, or give another port"), result.stderr[-2000:]
    assert "tensorflow" not in imported_modules(result.stderr)


def test_ctrl_c_stops_a_process_waiting_for_the_cluster_to_form(tmp_path):
    # Worker 0 waits inside TensorFlow's C++ for worker 1, which was never started: Python ran
    # no handler until that wait ended, so Ctrl-C did nothing, forever.
    import signal
    import socket
    import subprocess
    import time

    from helpers import started

    addresses = []
    for _ in range(2):
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            addresses.append(f"127.0.0.1:{free.getsockname()[1]}")
    tf_config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": 0}}
    (tmp_path / "pairs.tsv").write_text("Haus\thouse\n")
    os.environ["TF_CONFIG"] = json.dumps(tf_config)  # started() passes os.environ on
    try:
        process = started("train.py", f"--model_dir={tmp_path / 'run'}", "--strategy=multi_worker",
                          f"--train_files={tmp_path / 'pairs.tsv'}",
                          f"--dev_files={tmp_path / 'pairs.tsv'}")
    finally:
        del os.environ["TF_CONFIG"]
    try:
        assert process.stdout.readline().startswith("joining the cluster as worker 0 of 2")
        time.sleep(3)  # into TensorFlow's wait for worker 1
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    assert process.returncode == -signal.SIGINT, stderr[-2000:]  # as the shell reports it
    assert "Traceback" not in stderr


def test_workers_settings_are_compared_without_their_paths():
    from tfnmt.training import cluster_sync

    def settings(root, **train):
        return {"model_dir": f"{root}/runs/x", "preset": "tiny",
                "data": {"data_dir": f"{root}/data", "files": {"train": f"{root}/train.tsv"},
                         "tfds_data_dir": None, "vocab": [f"{root}/spm.model"],
                         "max_length": 64, "vocab_size": 600},
                "model": {"d_model": 64, "max_length": 64},
                "train": {"lr_scale": 1.0, "train_steps": 12, **train},
                "init_from": {"model_dir": f"{root}/runs/base",
                              "checkpoint": f"{root}/runs/base/best/ckpt-8", "optimizer": False}}

    chief = cluster_sync.comparable(settings("/shared"))
    # The same files mounted elsewhere on the worker's machine: the same settings.
    assert cluster_sync.differences(cluster_sync.comparable(settings("/mnt/nfs")), chief) == []
    other = settings("/mnt/nfs", lr_scale=3.0, clip_norm=1.0)
    other["data"]["max_length"] = other["model"]["max_length"] = 80  # one flag sets both
    other["init_from"]["checkpoint"] = "/mnt/nfs/runs/base/checkpoints/ckpt-8"
    other["init_from"]["optimizer"] = True
    assert cluster_sync.differences(cluster_sync.comparable(other), chief) == [
        ["clip_norm", 1.0, None], ["init_from", "checkpoints/ckpt-8", "best/ckpt-8"],
        ["init_optimizer", True, False], ["lr_scale", 3.0, 1.0], ["max_length", 80, 64]]
    assert cluster_sync._describe([["clip_norm", 1.0, None], ["lr_scale", 3.0, 1.0]],
                                  "here", "on the chief") == (
        "--clip_norm=1.0 here, (not given) on the chief; --lr_scale=3.0 here, 1.0 on the chief")


@pytest.mark.parametrize("mine, others, expected", [
    ("bf16", {"worker 1": "bf16", "worker 2": "bf16"}, ("bf16", "; the same on every worker")),
    ("none", {"worker 1": "none"}, ("none", "; the same on every worker")),
    ("bf16", {"worker 1": "bf16", "worker 2": "none"},
     ("none", "; worker 2 chose none: float32 on every worker")),
    ("none", {"worker 1": "bf16", "worker 2": "bf16"},
     ("none", "; worker 1 chose bf16, worker 2 chose bf16: float32 on every worker")),
])
def test_auto_trains_in_bf16_only_where_every_worker_chose_it(mine, others, expected):
    # Every process computes the same precision from the same choices (its own and the
    # others'), so none waits on another: a mixed cluster trains in float32 on every worker.
    from tfnmt.training import cluster_sync

    precision, reason = cluster_sync.combined_precision(mine, "auto: here", others)
    assert (precision, reason) == (expected[0], "auto: here" + expected[1])
    everyone = {"worker 0": mine, **others}
    for task, choice in everyone.items():
        rest = {other: value for other, value in everyone.items() if other != task}
        assert cluster_sync.combined_precision(choice, "", rest)[0] == precision


class CoordinationStore:
    """The coordination service's key-value store and barriers as the processes of a cluster
    (threads named "worker <i>" here) share them: a read waits for its key, a barrier for every
    process. The chief hosts the service: once it has stopped (`stopped`), a read fails. Worker
    2 reads slowly (a busy machine)."""

    def __init__(self, processes):
        import threading

        self.values, self.changed = {}, threading.Condition()
        self.barriers = {}
        self.processes = processes
        self.stopped = False

    def set_config_key_value(self, key, value):
        with self.changed:
            self.values[key] = value
            self.changed.notify_all()

    def get_config_key_value(self, key):
        import threading
        import time

        if threading.current_thread().name == "worker 2":
            time.sleep(0.25)
        with self.changed:
            if not self.changed.wait_for(lambda: key in self.values or self.stopped, timeout=20):
                raise TimeoutError(f"no process set {key}")
            if self.stopped:
                raise ConnectionError("the chief's coordination service is gone")
            return self.values[key]

    def wait_at_barrier(self, name, timeout_ms):
        import threading

        with self.changed:
            barrier = self.barriers.setdefault(name, threading.Barrier(self.processes))
        barrier.wait(timeout=20)


@pytest.mark.parametrize("name, precisions, expected", [
    ("bf16", ["bf16", "refused", "bf16"], [
        "worker 1 cannot train with --mixed_precision=bf16: no kernel on worker 1", "refused",
        "worker 1 cannot train with --mixed_precision=bf16: no kernel on worker 1"]),
    ("bf16", ["refused", "refused", "bf16"], [
        "refused", "refused",
        "worker 0 cannot train with --mixed_precision=bf16: no kernel on worker 0; "
        "worker 1 cannot train with --mixed_precision=bf16: no kernel on worker 1"]),
    ("bf16", ["bf16"] * 3, [("bf16", "")] * 3),
    ("auto", ["bf16", "none", "bf16"], [
        ("none", "auto 0; worker 1 chose none: float32 on every worker"),
        ("none", "auto 1; worker 0 chose bf16, worker 2 chose bf16: float32 on every worker"),
        ("none", "auto 2; worker 1 chose none: float32 on every worker")]),
])
def test_a_worker_that_refuses_its_precision_stops_every_worker_with_its_reason(
        monkeypatch, name, precisions, expected):
    # Each worker (a thread here) resolves its precision on its own CPU. One that refused
    # --mixed_precision=bf16 (a bfloat16 product would abort it) used to stop alone: the others
    # trained on until a collective found it gone, and said only that a worker stopped.
    import threading

    from tfnmt.training import cluster_sync
    from tfnmt.training.settings import SettingsError

    store = CoordinationStore(len(precisions))
    monkeypatch.setattr(cluster_sync, "in_cluster", lambda strategy: True)
    monkeypatch.setattr(cluster_sync, "context", types.SimpleNamespace(context=lambda: store))
    spec = {"worker": [f"host{i}:1" for i in range(len(precisions))]}
    outcomes = [None] * len(precisions)

    def worker(index):
        def resolve(requested):
            assert requested == name
            if precisions[index] == "refused":
                raise SettingsError(f"--mixed_precision=bf16: no kernel on worker {index}")
            return precisions[index], f"auto {index}" if name == "auto" else ""

        resolver = types.SimpleNamespace(task_type="worker", task_id=index,
                                         cluster_spec=lambda: types.SimpleNamespace(
                                             as_dict=lambda: spec))
        try:
            outcomes[index] = cluster_sync.agree_on_precision(
                types.SimpleNamespace(cluster_resolver=resolver), name, resolve)
        except SettingsError as error:
            own = str(error) == f"--mixed_precision=bf16: no kernel on worker {index}"
            outcomes[index] = "refused" if own else str(error)
            if index == 0:  # the chief stops, and its coordination service with it
                with store.changed:
                    store.stopped = True
                    store.changed.notify_all()
        except Exception as error:  # a read or a barrier that failed
            outcomes[index] = repr(error)

    threads = [threading.Thread(target=worker, args=(i,), name=f"worker {i}")
               for i in range(len(precisions))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes == expected


def test_workers_find_the_chiefs_file_only_in_the_directories_they_share(tmp_path):
    from tfnmt.training import cluster_sync

    model_dir, data_dir = str(tmp_path / "shared" / "run"), str(tmp_path / "shared" / "data")
    settings = {"model_dir": model_dir, "data": {"data_dir": None}}
    assert cluster_sync.shared_directories(settings) == [("model_dir", model_dir)]
    settings["data"]["data_dir"] = data_dir  # a --data_dir apart from the model_dir: it too
    directories = cluster_sync.shared_directories(settings)
    assert directories == [("model_dir", model_dir), ("data_dir", data_dir)]
    token = "host-123-456"
    chiefs = {"token": token, "written": cluster_sync._write_shared_files(directories, token)}
    assert chiefs["written"] == ["model_dir", "data_dir"]
    # The same directories through another path (a mount point elsewhere): found.
    os.symlink(tmp_path / "shared", tmp_path / "mnt")
    assert cluster_sync._unseen([("model_dir", str(tmp_path / "mnt" / "run")),
                                 ("data_dir", str(tmp_path / "mnt" / "data"))], chiefs) == []
    # Another data_dir (a worker's local disk), or one holding an earlier run's file: not.
    local = tmp_path / "local"
    local.mkdir()
    (local / cluster_sync.SHARED_FILE.format(token)).write_text("host-123-455")
    assert cluster_sync._unseen([("model_dir", model_dir), ("data_dir", str(local))],
                                chiefs) == [["data_dir", str(local)]]
    # A directory the chief could not write in (a read-only prepared --data_dir) is not judged.
    assert cluster_sync._unseen([("model_dir", model_dir), ("data_dir", str(local))],
                                dict(chiefs, written=["model_dir"])) == []
    cluster_sync._remove_shared_files(directories, token)
    assert os.listdir(model_dir) == [] and os.listdir(data_dir) == []


def test_a_chief_removes_the_files_chiefs_that_no_longer_run_left(tmp_path):
    # A chief ended by a signal while the workers check their settings leaves its file: the
    # next chief on the host removes the files of its host's processes that no longer run.
    import socket
    import subprocess
    import sys

    from tfnmt.training import cluster_sync

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()  # a pid that no longer runs
    host = socket.gethostname()
    left = {"dead": f"{host}-{ended.pid}-1", "running": f"{host}-{os.getpid()}-2",
            "other_host": f"{host}x-{ended.pid}-3",
            "hyphenated_host": f"{host}-{ended.pid}-{ended.pid}-4"}
    directories = [("model_dir", str(tmp_path / "run")), ("data_dir", str(tmp_path / "data"))]
    for _, path in directories:
        os.makedirs(path)
        for token in left.values():
            with open(os.path.join(path, cluster_sync.SHARED_FILE.format(token)), "w") as f:
                f.write(token)
        with open(os.path.join(path, "settings.json"), "w") as f:
            f.write("{}")
    cluster_sync._remove_dead_chiefs_files(directories + [("data_dir", str(tmp_path / "no"))])
    for _, path in directories:
        assert sorted(os.listdir(path)) == sorted(
            ["settings.json"] + [cluster_sync.SHARED_FILE.format(left[k])
                                 for k in ("running", "other_host", "hyphenated_host")])


@pytest.mark.parametrize("error, said", [
    (KeyboardInterrupt(), "it was interrupted"),
    (KeyboardInterrupt("2 of 4 shards written"), "it was interrupted: 2 of 4 shards written"),
    (ValueError("train.tsv line 3 is not UTF-8"), "train.tsv line 3 is not UTF-8"),
    (ValueError(), "ValueError")])
def test_the_other_workers_say_how_the_chiefs_work_ended(monkeypatch, error, said):
    # The chief's failure reaches the others through the cluster's key-value store (a dict
    # here); a Ctrl-C, whose exception says nothing, is named as an interruption.
    from tfnmt.training import cluster_sync
    from tfnmt.training.trainer import TrainingError

    store = {}

    class Store:
        def set_config_key_value(self, key, value):
            store[key] = value

        def get_config_key_value(self, key):
            return store[key]

        def wait_at_barrier(self, name, timeout_ms):
            pass

    def work():
        raise error

    monkeypatch.setattr(cluster_sync, "in_cluster", lambda strategy: True)
    monkeypatch.setattr(cluster_sync, "context", types.SimpleNamespace(context=Store))
    for chief in (True, False):
        monkeypatch.setattr(cluster_sync, "task_role", lambda strategy: (chief, 0))
        if chief:
            with pytest.raises(type(error)):
                cluster_sync.chief_first(None, "prepare the data", work)
        else:
            with pytest.raises(TrainingError) as raised:
                cluster_sync.chief_first(None, "prepare the data", work)
            assert str(raised.value) == f"the chief could not prepare the data: {said}"
