"""Writing a `serving.TranslationModule` as a SavedModel version for TensorFlow Serving:
`<export_dir>/<version>/`, written under a temporary name with its warmup requests, loaded with
TensorFlow's C++ loader (as TF Serving loads it) and those requests run, then renamed into
place."""
import errno
import logging
import os
import re
import shutil

from tfnmt.inference.decoding_threads import write_search_settings
from tfnmt.inference.serving import PREFIXES, SCORE_TARGETS, SIGNATURE_INPUT
from tfnmt.paths import made_directory, next_version


SIGNATURES = ("serving_default", "translate_n_best", "translate_with_prefix", "score")
CHECK_SENTENCES = ("Guten Morgen!", "")
# TF Serving runs the PredictionLog records of this file when it loads a version (SavedModel
# Warmup), so that no client request pays for the first run of a signature.
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")


class ExportCheckError(RuntimeError):
    """The written SavedModel failed under TensorFlow's C++ loader (as TF Serving runs it)."""


def export_saved_model(module, export_dir, version=None, check=True, extra_files=()):
    """Writes a new SavedModel version for TF Serving.

    The version is written under a temporary name and renamed when complete, so a watching
    TF Serving never loads half a model; an existing version is never overwritten. It holds
    warmup requests (`WARMUP_FILE`: each signature on CHECK_SENTENCES), which TF Serving runs
    when it loads the version: the first run of a signature in a process prepares its graph
    (seconds for a beam search), and warmed up no client request waits for that. Its number
    of parallel searches is recorded for the tfnmt commands (`decoding_threads.SEARCH_FILE`).

    Args:
      module: a `TranslationModule`.
      export_dir: the directory of numbered versions.
      version: the version number; default the next integer.
      check: load the written model with TensorFlow's C++ loader, as TF Serving loads it,
        and run its warmup requests before it is renamed into place.
      extra_files: paths of files copied into the version's assets.extra (which TF Serving
        leaves alone) for the tfnmt commands.

    Returns:
      The version's path, `<export_dir>/<version>`.

    Raises:
      ExportCheckError: the check failed (the temporary directory is removed).
      FileExistsError: the version exists (a given `version`, also when another export
        published it while this one was written)."""
    chosen = version is None
    version = next_version(export_dir) if chosen else int(version)
    final = os.path.join(export_dir, str(version))
    if os.path.exists(final):
        raise FileExistsError(f"{final} exists; versions are never overwritten")
    with made_directory(export_dir):
        return _publish(module, export_dir, version, chosen, check, extra_files)


def _publish(module, export_dir, version, chosen, check, extra_files):
    """`export`'s work in an existing export_dir: writes, checks and renames the version."""
    final = os.path.join(export_dir, str(version))
    remove_abandoned_exports(export_dir)
    temporary = os.path.join(export_dir, f".tmp-{version}-{os.getpid()}")
    try:
        write_saved_model(module, temporary)
        write_warmup_requests(temporary)
        write_search_settings(temporary, module.parallel_searches)
        for path in extra_files:
            shutil.copyfile(path, os.path.join(temporary, "assets.extra", os.path.basename(path)))
        if check:
            check_with_session_loader(temporary)
        while True:
            try:  # a rename never replaces a version with files in it
                os.rename(temporary, final)
                break
            except OSError as error:
                if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                if not chosen:
                    raise FileExistsError(f"{final} was published by another export while this "
                                          "one was written; versions are never overwritten")
                # Another export took the number: this one is the next version.
                version = next_version(export_dir)
                final = os.path.join(export_dir, str(version))
    finally:
        if os.path.exists(temporary):
            shutil.rmtree(temporary)
    return final


def _process_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def remove_abandoned_exports(export_dir):
    """Removes `.tmp-<version>-<pid>/` folders whose exporting process is gone (killed mid-export);
    ones a live process is still writing stay.

    Args:
      export_dir: the directory of numbered versions.

    Returns:
      The folders removed.
    """
    removed = []
    for entry in sorted(os.listdir(export_dir)):
        match = re.fullmatch(r"\.tmp-\d+-(\d+)", entry)
        path = os.path.join(export_dir, entry)
        if match and os.path.isdir(path) and not _process_alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if removed:
        logging.warning("removed %s, left by interrupted exports", ", ".join(removed))
    return removed


def write_saved_model(module, path):
    """Writes the module's signatures as a SavedModel.

    The saved object holds the variables the signatures read (the `tf.Variable`s inside the
    Keras variables, once each: the C++ loader restores exactly those), the copies of weights
    that the searches multiply by (`linear.kept_copies`: the output kernel transposed, the
    self-attention's kernels side by side, per matmul dtype), the SentencePiece tokenizers
    (resources), the module's `source_lengths` (a function for Python clients, not a
    signature) and, for an "auto" export, its choice of search. Each signature is
    traced once, inside `tf.saved_model.save`: a trace made before it would not be reused (the
    save context is part of a trace's cache key), and tracing the searches is most of an
    export's time. (Saving an object that holds the Keras model itself would save a second copy
    of each variable, which the C++ loader restores while the graph reads the never-initialised
    originals: every TF Serving request would fail.)

    Args:
      module: a `TranslationModule`.
      path: the SavedModel directory to write.
    """
    import tensorflow as tf

    from tfnmt.layers.linear import kept_copies

    root = tf.__internal__.tracking.AutoTrackable()
    root.weights = [v.value for v in module.model.variables]  # keras.Variable -> tf.Variable
    root.tokenizers = list({id(t): t for t in (module.source_tokenizer,
                                               module.target_tokenizer)}.values())
    if module.precision is not None:
        # An "auto" export's choice: the variable only (its module holds the output weights).
        root.search_precision = module.precision.choice
    # What the searches multiply by that is not a weight as it is (the output kernel
    # transposed, the self-attention's query, key and value kernels side by side): made here
    # and saved as variables, so that no request makes them again. The module keeps them: a
    # second export of it reuses the first one's traces, which read them.
    signatures = {"serving_default": module.serve, "translate_n_best": module.serve_n_best,
                  "translate_with_prefix": module.serve_with_prefix, "score": module.score}
    for name, function in signatures.items():
        setattr(root, name, function)
    root.source_lengths = module.source_lengths  # for Python clients: not a signature
    with kept_copies(module.decoding_copies):
        for matmul_dtype in module.search_dtypes():
            with module.decoding_scope(matmul_dtype):
                pass  # eagerly: makes the copies
        root.decoding_copies = list(module.decoding_copies.values())
        tf.saved_model.save(root, path, signatures=signatures)


def write_warmup_requests(path, sentences=CHECK_SENTENCES):
    """Writes TF Serving's warmup file (`WARMUP_FILE`): a TFRecord of PredictionLog protos, one
    Predict request per signature (`SIGNATURES`).

    Args:
      path: the SavedModel directory.
      sentences: the sentences of every request; also the prefixes and the translations
        scored.
    """
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    os.makedirs(os.path.dirname(os.path.join(path, WARMUP_FILE)), exist_ok=True)
    strings = tf.make_tensor_proto([s.encode() for s in sentences], dtype=tf.string)
    inputs = {"translate_with_prefix": (SIGNATURE_INPUT, PREFIXES),
              "score": (SIGNATURE_INPUT, SCORE_TARGETS)}  # each sentence its own target
    with tf.io.TFRecordWriter(os.path.join(path, WARMUP_FILE)) as writer:
        for name in SIGNATURES:
            request = predict_pb2.PredictRequest()
            request.model_spec.signature_name = name
            for key in inputs.get(name, (SIGNATURE_INPUT,)):
                request.inputs[key].CopyFrom(strings)
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())


def read_warmup_requests(path):
    """The warmup requests of a SavedModel, as TF Serving reads them (in eager mode).

    Args:
      path: the SavedModel directory.

    Returns:
      [(signature name, {input name: numpy array})] in the file's order.
    """
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    requests = []
    for record in tf.data.TFRecordDataset(os.path.join(path, WARMUP_FILE)).as_numpy_iterator():
        request = prediction_log_pb2.PredictionLog.FromString(record).predict_log.request
        requests.append((request.model_spec.signature_name or "serving_default",
                         {key: tf.make_ndarray(proto) for key, proto in request.inputs.items()}))
    return requests


def check_with_session_loader(path):
    """Loads a SavedModel with TensorFlow's C++ loader (`session_loader`), as TF Serving does, and
    runs its warmup requests (`WARMUP_FILE`), as TF Serving does when it loads a version.

    Args:
      path: the SavedModel directory.

    Raises:
      ExportCheckError: the load failed, a signature has no warmup request, or a request did
        not answer with a translation (or a score) per sentence.
    """
    from tfnmt.inference.session_loader import SessionLoaderError, SessionModel

    if not os.path.exists(os.path.join(path, WARMUP_FILE)):
        raise ExportCheckError(f"{path} has no {WARMUP_FILE}")
    requests = read_warmup_requests(path)
    missing = sorted(set(SIGNATURES) - {name for name, _ in requests})
    if missing:
        raise ExportCheckError(f"{WARMUP_FILE} has no request for {', '.join(missing)}")
    try:
        with SessionModel(path) as served:
            for name, feed in requests:
                outputs = {"scores", "lengths"} if name == "score" else {"translations", "scores"}
                if name not in served.signatures:
                    raise ExportCheckError(f"{WARMUP_FILE} asks for {name!r}, which the export "
                                           "does not have")
                try:
                    out = served.run(name, feed)
                except KeyError as error:  # the request's inputs are not the signature's
                    raise ExportCheckError(f"{WARMUP_FILE}: {error.args[0]}") from error
                rows = len(feed[SIGNATURE_INPUT])
                if {k: v.shape[:1] for k, v in out.items()} != {k: (rows,) for k in outputs}:
                    raise ExportCheckError(f"{name} answered {rows} sentences with "
                                           f"{ {k: v.shape for k, v in out.items()} }")
    except SessionLoaderError as error:
        raise ExportCheckError(f"the export does not run under TensorFlow's C++ loader "
                               f"(TF Serving's): {error}") from error
