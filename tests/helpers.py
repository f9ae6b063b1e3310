"""Small builders shared by the tests."""
import atexit
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile

import keras
import numpy as np

from preload_server import PER_PROGRAM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# TFNMT_TEST_PRELOAD=0: every entry point a test runs starts as a fresh process.
PRELOAD = os.environ.get("TFNMT_TEST_PRELOAD", "1") != "0"
_servers = {}  # kind ("train", "decode"): (server process, socket path)


def _compared(environment):
    """What of an environment must be the server's (the rest a server's child takes from its
    client)."""
    return {k: v for k, v in environment.items() if k not in PER_PROGRAM}


# The servers' environment: the entry points' usual one, as the suite's process has it before
# any test changes it.
_SERVER_ENVIRONMENT = _compared(dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


def entry_point_command(script, environment):
    """The command that runs an entry point (train.py, export.py, translate.py, evaluate.py)
    as `python <script>` started fresh with `environment` would run it: through this worker's
    tests/preload_server.py for its kind where `environment` is the server's but for
    `preload_server.PER_PROGRAM`, which saves the program TensorFlow's import (see there); else
    `python <script>`."""
    path = os.path.join(ROOT, script)
    if not PRELOAD or _compared(environment) != _SERVER_ENVIRONMENT or \
            script not in ("train.py", "export.py", "translate.py", "evaluate.py"):
        return [sys.executable, path]
    return [sys.executable, os.path.join(ROOT, "tests", "preload_client.py"),
            preload_server("train" if script == "train.py" else "decode"), path]


def preload_server(kind):
    """The socket path of this worker's tests/preload_server.py for `kind` ("train" or
    "decode"), started on first use (its clients wait while it imports)."""
    if kind not in _servers:
        directory = tempfile.mkdtemp(prefix="tfnmt-preload-")  # short: a socket path's limit
        socket_path = os.path.join(directory, kind)
        with open(os.path.join(directory, "log"), "w") as log:
            # Its stdin: a pipe that closes when this worker ends, and the server with it.
            server = subprocess.Popen(
                [sys.executable, os.path.join(ROOT, "tests", "preload_server.py"),
                 socket_path, kind], env=_SERVER_ENVIRONMENT, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        server.stdout.readline()  # "listening" (or nothing, where it failed: clients run fresh)
        _servers[kind] = (server, socket_path)
        atexit.register(_stop_server, server, directory)
    return _servers[kind][1]


def _stop_server(server, directory):
    server.kill()
    server.wait()
    shutil.rmtree(directory, ignore_errors=True)


def python(script, *args, env=None, timeout=300, cwd=ROOT, input=None):
    """Runs one of the entry points (train.py, export.py, ...) as a fresh process would
    (`entry_point_command`; `input`: its standard input's text)."""
    environment = dict(os.environ, **{"TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})
    return subprocess.run([*entry_point_command(script, environment), *args], cwd=cwd,
                          env=environment, timeout=timeout, capture_output=True, text=True,
                          input=input)


def piece_counts(model_path, texts):
    """How many pieces the sentencepiece package splits `texts` into with this model."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=model_path)
    return sum(len(processor.encode(text)) for text in texts)


def imported_modules(stderr):
    """The modules a process run with PYTHONPROFILEIMPORTTIME=1 imported, from its stderr (where
    Python lists each one)."""
    return {line.split("|")[-1].strip() for line in stderr.splitlines()
            if line.startswith("import time:")}


def built_once(tmp_path_factory, name, build):
    """A directory that `build(path)` fills once for every pytest-xdist worker of a run: the
    first worker to get here builds it while the others wait on a lock, then all read it (so
    its users must not change it). Without xdist, each call builds its own.

    Returns:
      The directory's path (str).
    """
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # the same in every worker of a run
    if run_id:
        shared = tmp_path_factory.getbasetemp().parent / f"{name}-{run_id}"
        shared.mkdir(exist_ok=True)
    else:
        shared = tmp_path_factory.mktemp(name)
    path = str(shared / "run")
    with open(shared / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(shared / "done"):
            shutil.rmtree(path, ignore_errors=True)  # a worker's failed build
            build(path)
            (shared / "done").touch()
    return path


def started(script, *args, **environment):
    """An entry point started as a fresh process would be (`entry_point_command`; stdout and
    stderr piped, text), with Ctrl-C's SIGINT and a closed terminal's SIGHUP acting as at a
    terminal: a test runner started in the background (`cmd &` in a script) has SIGINT
    ignored, one under nohup SIGHUP, and its children would inherit that. `environment`:
    variables added to this process's."""
    import signal

    def as_at_a_terminal():
        for signum in (signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)

    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **environment)
    return subprocess.Popen([*entry_point_command(script, environment), *args], cwd=ROOT,
                            env=environment, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=as_at_a_terminal)


def train_flags(small_corpus, train_data, model_dir, **overrides):
    """train.py's command line for a tiny run on the small corpus (train_data: its prepared
    records, or None to prepare them in the model_dir). One layer a side: a run traces and
    optimises half the graph of the preset's two (the layers' own tests stack two or more)."""
    flags = {"model_dir": model_dir, "dataset": "files", "train_files": small_corpus["train"],
             "dev_files": small_corpus["dev"], "data_dir": train_data, "vocab_size": 600,
             "preset": "tiny", "num_layers": 1, "batch_tokens": 512, "max_length": 64,
             "train_steps": 12, "warmup_steps": 5, "log_every": 4, "checkpoint_every": 4,
             "eval_every": 8, "bleu_sentences": 8, "average_last": 3,
             "alpha": 0.6}  # None: train.py's default, chosen on dev at the end
    flags.update(overrides)
    return ["train.py"] + [f"--{k}={v}" for k, v in flags.items() if v is not None]


def run_layer_test(layer_class, init_kwargs, call_args, call_kwargs=None,
                   expected_parameters=0, expected_weights=0, mixed_precision=True):
    """keras-hub's run_layer_test, in small, for one of tfnmt's layers:
    - from_config(get_config()) and Keras (de)serialisation keep the config, and with the
      weights copied the clone gives the same output;
    - the layer holds `expected_weights` trainable variables, `expected_parameters` numbers;
    - a training step: each trainable variable gets a finite, nonzero gradient of the
      output's sum of squares (so every weight is used);
    - under the mixed_bfloat16 policy: float32 variables, a bfloat16 output close to the
      float32 layer's with the same weights.
    Returns the float32 layer."""
    call_kwargs = call_kwargs or {}
    tf = __import__("tensorflow")
    layer = layer_class(**init_kwargs)
    expected = layer(*call_args, **call_kwargs)
    config = layer.get_config()
    clone = layer_class.from_config(config)
    assert clone.get_config() == config
    clone(*call_args, **call_kwargs)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(clone(*call_args, **call_kwargs), expected, atol=1e-6)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is type(layer) and restored.get_config() == config

    weights = layer.trainable_weights
    assert len(weights) == expected_weights
    assert sum(int(np.prod(w.shape)) for w in weights) == expected_parameters
    if weights:
        with tf.GradientTape() as tape:
            out = layer(*call_args, **dict(call_kwargs, training=True))
            loss = tf.reduce_sum(tf.square(tf.cast(out, tf.float32)))
        for weight, grad in zip(weights, tape.gradient(loss, weights)):
            grad = tf.convert_to_tensor(grad).numpy()
            assert np.all(np.isfinite(grad)) and np.abs(grad).max() > 0, weight.path

    if mixed_precision:
        mixed = layer_class(**dict(init_kwargs, dtype="mixed_bfloat16"))
        mixed(*call_args, **call_kwargs)
        mixed.set_weights(layer.get_weights())
        out = mixed(*call_args, **call_kwargs)
        assert out.dtype == tf.bfloat16
        assert all(w.dtype == "float32" for w in mixed.weights)
        scale = float(np.abs(expected).max())
        np.testing.assert_allclose(tf.cast(out, tf.float32), expected, rtol=0,
                                   atol=0.05 * scale)
    return layer


def random_ids(rng, batch, length, vocab_size, low=4):
    return rng.integers(low, vocab_size, size=(batch, length)).astype("int32")


def output_log_probs(model, source_ids, outputs):
    """float64 log P(o_t | o_<t, source) of each id of `outputs` (a list of ids: subwords, then
    EOS where there is one), each scored after BOS and the ids before it, from the model's
    logits recomputed over the whole output (numpy's log-softmax). source_ids: [1, S]."""
    import tensorflow as tf

    from tfnmt.data.special_tokens import BOS_ID

    outputs = [int(t) for t in outputs]
    decoder_in = tf.constant([[BOS_ID] + outputs[:-1]])
    logits = model((tf.convert_to_tensor(source_ids), decoder_in),
                   training=False).numpy()[0].astype(np.float64)  # [T, V]
    log_probs = logits - logits.max(1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(1, keepdims=True))
    return log_probs[np.arange(len(outputs)), outputs]


def teacher_forced_log_prob(model, vocabulary, source, target):
    """log P(target | source) from the model's logits, in float64 numpy: the subwords of the
    target, then EOS, each scored after BOS and the subwords before it. `vocabulary`: a shared
    SentencePiece model's bytes or (source, target) bytes; tokenized with the sentencepiece
    package."""
    import sentencepiece

    from tfnmt.data.special_tokens import EOS_ID
    from tfnmt.data.vocabulary import as_protos

    protos = as_protos(vocabulary)
    source_ids = sentencepiece.SentencePieceProcessor(model_proto=protos.source).encode(
        source)[: model.max_length - 1] + [EOS_ID]
    target_ids = sentencepiece.SentencePieceProcessor(model_proto=protos.target).encode(
        target)[: model.max_length - 1]
    outputs = target_ids + [EOS_ID]
    return float(output_log_probs(model, [source_ids], outputs).sum()), len(outputs)
