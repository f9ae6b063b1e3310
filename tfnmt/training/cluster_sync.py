"""What the processes of a `multi_worker` cluster agree on outside the training collectives,
through the key-value store and barriers of TensorFlow's coordination service:

- at the start, the settings and the directories: each worker compares its own settings with
  the chief's, and looks in its --model_dir (and --data_dir) for a file the chief has just
  written in its own; a worker started with other flags (another --lr_scale, --train_steps,
  preset), or whose directories are not the chief's (a local disk instead of the shared file
  system), stops the cluster in one line. Without this a cluster trains on: each worker updates
  its copy of the weights with its own settings from the shared gradients (or from weights
  that were not restored), and the copies drift apart silently;
- the precision: with `--mixed_precision=auto` each process times its own CPU, and the
  cluster takes bf16 only where every worker chose it (float32 is safe on every CPU; a worker
  whose CPU lacks native bf16 would emulate it, or abort under an ISA cap); a worker that
  refuses `--mixed_precision=bf16` stops every process with its reason;
- the chief's work that the others wait for (preparing the data): they wait as long as it
  takes, and stop with the chief's error where it fails;
- at the end, leaving together: a worker whose training is done waits while the chief
  evaluates and reports (else the chief's coordination service logs, mid-report, that the
  worker "crashed").

Paths may differ between machines (a shared file system mounted elsewhere); what they hold is
compared where it is read (the prepared data's manifest, the checkpoints).
"""
import json
import os
import socket
import time

import tensorflow as tf
from tensorflow.python.eager import context

from tfnmt.training.cluster import TRAINING_JOBS
from tfnmt.training.distribute import task_role
from tfnmt.training.settings import SettingsError
from tfnmt.training.stop_signals import stopping_at_once
from tfnmt.training.trainer import TrainingError

SETTINGS_KEY = "tfnmt/settings"
# The file (named with the run's token) that the chief writes in its directories for the
# others to find in theirs: a name never looked up before, which no file system cache holds.
SHARED_FILE = ".cluster-{}"
VERDICT_KEY = "tfnmt/settings_verdict/{}/{}"
OUTCOME_KEY = "tfnmt/settings_outcome"
PRECISION_KEY = "tfnmt/precision/{}/{}"
# What a process that refused its precision publishes instead of one, before its reason.
REFUSED = "refused: "
END_BARRIER = "tfnmt/end"
# How long a worker waits at the end for the chief's evaluation and test report.
END_WAIT_MS = 7 * 24 * 3600 * 1000
# How long each process waits for all to have read the chief's failure or refusal.
FAILURE_READ_MS = 60 * 1000
# Settings that are paths on this machine (what they hold is compared where it is read).
_PATHS = {("model_dir",), ("data", "data_dir"), ("data", "tfds_data_dir"), ("data", "files"),
          ("data", "vocab")}


def in_cluster(strategy):
    """Whether `strategy` trains a cluster of processes (`multi_worker`)."""
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def comparable(settings):
    """`settings` (a run's resolved settings) without what may differ between machines, as
    {"section.key": value}; an --init_from checkpoint is named relative to its model_dir."""
    flat = {}

    def walk(node, path):
        for key, value in node.items():
            if path + (key,) in _PATHS:
                continue
            if isinstance(value, dict):
                walk(value, path + (key,))
            else:
                flat[".".join(path + (key,))] = value

    walk({k: v for k, v in settings.items() if k != "init_from"}, ())
    source = settings.get("init_from")
    if source:
        flat["init_from"] = os.path.relpath(source["checkpoint"], source["model_dir"])
        flat["init_optimizer"] = source["optimizer"]
    return json.loads(json.dumps(flat))  # as the chief's read back: lists, not tuples


def differences(mine, chiefs):
    """[flag name, this worker's value, the chief's value] of each setting whose values differ
    (None where a side does not have it); a flag that sets two (--max_length) named once."""
    found = {}
    for key in sorted(set(mine) | set(chiefs)):
        if mine.get(key) != chiefs.get(key):
            found.setdefault(key.rsplit(".", 1)[-1], [mine.get(key), chiefs.get(key)])
    return [[name, *values] for name, values in sorted(found.items())]


def _describe(found, worker, chief):
    """`found` (`differences`) in words, the worker's value called `worker` ("here", "there")
    and the chief's `chief`."""
    return "; ".join(f"--{name}={_shown(mine)} {worker}, {_shown(chiefs)} {chief}"
                     for name, mine, chiefs in found)


def _shown(value):
    return "(not given)" if value is None else value


def _other_tasks(strategy):
    spec = strategy.cluster_resolver.cluster_spec().as_dict()
    me = (strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id)
    return [(job, index) for job in TRAINING_JOBS for index in range(len(spec.get(job, [])))
            if (job, index) != me]


def shared_directories(settings):
    """[(flag, path)] of the directories every worker must share with the chief: the
    model_dir, and a --data_dir given apart from it."""
    directories = [("model_dir", settings["model_dir"])]
    if settings["data"].get("data_dir"):
        directories.append(("data_dir", settings["data"]["data_dir"]))
    return directories


def _write_shared_files(directories, token):
    """Writes the file named by `token` in each directory; returns the flags of those written
    (a read-only --data_dir that holds prepared data is not written, nor compared)."""
    written = []
    for flag, path in directories:
        try:
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, SHARED_FILE.format(token)), "w") as f:
                f.write(token)
            written.append(flag)
        except OSError:
            pass
    return written


def _remove_shared_files(directories, token):
    for _, path in directories:
        try:
            os.remove(os.path.join(path, SHARED_FILE.format(token)))
        except OSError:
            pass


def _remove_dead_chiefs_files(directories):
    """Removes the files that chiefs of this host which no longer run left in `directories`:
    a signal during the workers' check ends the chief at once (`stopping_at_once`), before it
    removes its own. A file of another host, or of a process still running (a cluster starting
    beside this one on a shared --data_dir), stays."""
    prefix = SHARED_FILE.format(f"{socket.gethostname()}-")
    for _, path in directories:
        try:
            names = [n for n in os.listdir(path) if n.startswith(prefix)]
        except OSError:
            continue
        for name in names:
            pid_and_time = name[len(prefix):].split("-")  # the token's other two parts
            if len(pid_and_time) != 2 or not all(p.isdigit() for p in pid_and_time) or \
                    _running(int(pid_and_time[0])):
                continue
            try:
                os.remove(os.path.join(path, name))
            except OSError:
                pass


def _running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def _unseen(directories, chiefs):
    """[flag, path] of the `directories` (this worker's) that do not hold the file the chief
    wrote in its own (`chiefs`: what the chief published)."""
    unseen = []
    for flag, path in directories:
        if flag not in chiefs["written"]:
            continue
        try:
            with open(os.path.join(path, SHARED_FILE.format(chiefs["token"]))) as f:
                seen = f.read() == chiefs["token"]
        except OSError:
            seen = False
        if not seen:
            unseen.append([flag, path])
    return unseen


def _refusal(verdicts, chief, chiefs_value, tasks_value, chiefs_directories):
    """One line of every [task, verdict] in `verdicts`: the settings that differ (the task's
    value described as `tasks_value`, the chief's as `chiefs_value`) and the directories it does
    not share with `chief` ("this chief", "the chief")."""
    clauses, advice = [], []
    for task, verdict in verdicts:
        if verdict["settings"]:
            clauses.append(f"{task} was started with other settings than {chief}: "
                           f"{_describe(verdict['settings'], tasks_value, chiefs_value)}")
            advice.append("start every worker with the same flags")
        for flag, path in verdict["unseen"]:
            clauses.append(f"{task} does not find the files of {chief}'s "
                           f"--{flag}={chiefs_directories[flag]} in its --{flag}={path}")
            advice.append("every worker needs its --model_dir and --data_dir on a file system "
                          "shared with the chief")
    return "; ".join(clauses) + f" ({'; '.join(dict.fromkeys(advice))})"


def agree_on_start(strategy, settings):
    """Under `multi_worker`, refuses to train unless every worker has the chief's settings and
    sees the chief's model_dir (and data_dir): the chief writes a file in those directories and
    publishes its settings and the file's name; each worker compares the settings with its own,
    looks for the file in its directories and publishes what differs; the chief removes the
    files and publishes the outcome, which every process then acts on.

    Raises:
      SettingsError: on every process, naming the workers, the flags that differ and the
        directories not shared.
    """
    if not in_cluster(strategy):
        return
    ctx = context.context()
    is_chief, _ = task_role(strategy)
    resolver = strategy.cluster_resolver
    me = f"{resolver.task_type} {resolver.task_id}"
    mine = comparable(settings)
    directories = shared_directories(settings)
    if is_chief:
        token = f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}"
        _remove_dead_chiefs_files(directories)
        written = _write_shared_files(directories, token)
        try:
            with stopping_at_once():  # for every worker's check of its settings
                ctx.set_config_key_value(SETTINGS_KEY, json.dumps(
                    {"settings": mine, "token": token, "written": written,
                     "directories": dict(directories)}, sort_keys=True))
                refused = []
                for job, index in _other_tasks(strategy):  # each get waits for that verdict
                    verdict = json.loads(ctx.get_config_key_value(VERDICT_KEY.format(job,
                                                                                     index)))
                    if verdict["settings"] or verdict["unseen"]:
                        refused.append([f"{job} {index}", verdict])
        finally:
            _remove_shared_files(directories, token)
        ctx.set_config_key_value(OUTCOME_KEY, json.dumps(refused))
        if refused:  # every process refuses: each waits until the others have read why
            _until_read(ctx, OUTCOME_KEY)
        chiefs_directories = dict(directories)
    else:
        with stopping_at_once():  # for the chief's settings
            chiefs = json.loads(ctx.get_config_key_value(SETTINGS_KEY))
        unseen = _unseen(directories, chiefs)
        # A worker that does not see the chief's model_dir resolves its settings from another
        # (a new run's beside the chief's resumed one): their differences would only mislead.
        verdict = {"settings": [] if "model_dir" in dict(unseen) else
                   differences(mine, chiefs["settings"]), "unseen": unseen}
        ctx.set_config_key_value(VERDICT_KEY.format(resolver.task_type, resolver.task_id),
                                 json.dumps(verdict))
        if verdict["settings"] or verdict["unseen"]:
            _until_read(ctx, OUTCOME_KEY)
            raise SettingsError(_refusal([["this worker", verdict]], "the chief", "on the chief",
                                         "here", chiefs["directories"]))
        with stopping_at_once():  # for the chief's verdict on every worker's settings
            refused = json.loads(ctx.get_config_key_value(OUTCOME_KEY))
        if refused:
            _until_read(ctx, OUTCOME_KEY)
        chiefs_directories = chiefs["directories"]
    refused = [[task, verdict] for task, verdict in refused if task != me]
    if refused:
        chief, chiefs_value = ("this chief", "here") if is_chief else ("the chief", "on the chief")
        raise SettingsError(_refusal(refused, chief, chiefs_value, "there", chiefs_directories))


def agree_on_precision(strategy, name, resolve):
    """The precision every process trains in: `resolve(name)` on this process; under
    `multi_worker` each publishes what it resolved, or its refusal, and reads the others':
    - a refusal on any worker (`--mixed_precision=bf16` where a bfloat16 product would abort)
      stops every process in one line that names the worker and why (else the others went
      on until their first collective found it gone, and said only that);
    - with `auto`, where the CPUs chose differently, all train in float32 ("none"), which is
      safe on every CPU.

    Args:
      strategy: the training strategy.
      name: --mixed_precision ("auto", "none", "bf16", "fp16"), the same on every worker.
      resolve: name -> (precision, reason) (`precision.resolve_mixed_precision`); it may
        raise SettingsError.

    Returns:
      (precision, reason): the agreed precision, and why, for the log.

    Raises:
      SettingsError: this process's refusal, or another worker's.
    """
    if not in_cluster(strategy):
        return resolve(name)
    refusal = None
    try:
        precision, reason = resolve(name)
    except SettingsError as error:
        refusal, precision, reason = error, REFUSED + str(error), ""
    ctx = context.context()
    resolver = strategy.cluster_resolver
    ctx.set_config_key_value(PRECISION_KEY.format(resolver.task_type, resolver.task_id),
                             precision)
    choices = {}
    with stopping_at_once():  # for every other process's timing
        for job, index in _other_tasks(strategy):
            choices[f"{job} {index}"] = ctx.get_config_key_value(
                PRECISION_KEY.format(job, index))
    refused = {task: choice[len(REFUSED):] for task, choice in choices.items()
               if choice.startswith(REFUSED)}
    if refusal is not None or refused:
        _until_read(ctx, PRECISION_KEY.format("refused", "any"))  # every process stops here
        if refusal is not None:
            raise refusal
        raise SettingsError("; ".join(f"{task} cannot train with {message}"
                                      for task, message in refused.items()))
    if name != "auto":
        return precision, reason
    return combined_precision(precision, reason, choices)


def combined_precision(precision, reason, choices):
    """(precision, reason) for the whole cluster: this process's `precision` where every other
    task's in `choices` ({task name: precision}) is the same, else "none"."""
    others = sorted(task for task, choice in choices.items() if choice != precision)
    if not others:
        return precision, f"{reason}; the same on every worker"
    named = ", ".join(f"{task} chose {choices[task]}" for task in others)
    return "none", f"{reason}; {named}: float32 on every worker"


def chief_first(strategy, what, work):
    """Runs `work` on the chief alone (under `multi_worker`; else simply runs it) while the
    other workers wait for it, however long it takes.

    Args:
      strategy: the training strategy.
      what: the work in words ("prepare the data"), for the others' error.
      work: called without arguments.

    Returns:
      work()'s result on the chief (or a single process); None on the other workers.

    Raises:
      TrainingError: on the other workers, where `work` failed on the chief (its error).
    """
    if not in_cluster(strategy):
        return work()
    ctx = context.context()
    key = f"tfnmt/chief_first/{what}"
    if task_role(strategy)[0]:
        try:
            result = work()
        except BaseException as error:
            ctx.set_config_key_value(key, json.dumps(_failure(error)))
            if isinstance(error, Exception):  # not on Ctrl-C
                _until_read(ctx, key)
            raise
        ctx.set_config_key_value(key, json.dumps(None))
        return result
    with stopping_at_once():  # for the chief's work, however long it takes
        failure = json.loads(ctx.get_config_key_value(key))
    if failure is not None:
        _until_read(ctx, key)
        raise TrainingError(f"the chief could not {what}: {failure}")
    return None


def _failure(error):
    """What the other workers say the chief's `work` ended with: its error's message, or that
    the chief was interrupted (Ctrl-C's KeyboardInterrupt says nothing by itself)."""
    if isinstance(error, KeyboardInterrupt):
        return "it was interrupted" + (f": {error}" if str(error) else "")
    return str(error) or type(error).__name__


def _until_read(ctx, key):
    """Where every process is about to stop on what the chief stored under `key` (its
    failure, its refusal): each waits (up to FAILURE_READ_MS) until all have read it, since the
    chief holds the cluster's key-value store: a worker whose read was still under way when the
    chief ended lost the chief instead of learning why."""
    try:
        with stopping_at_once():
            ctx.wait_at_barrier(f"{key}/read", FAILURE_READ_MS)
    except tf.errors.OpError:  # a worker that never reads it: the chief's error stands
        pass


def leave_together(strategy):
    """Under `multi_worker`, returns once every process has called it (the workers once the
    chief has reported): True, or False where another process stopped before it did."""
    if not in_cluster(strategy):
        return True
    try:
        with stopping_at_once():  # for the chief's evaluation and report
            context.context().wait_at_barrier(END_BARRIER, END_WAIT_MS)
        return True
    except tf.errors.OpError:
        return False
