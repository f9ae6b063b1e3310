"""The exported translator: raw strings in, translations out, everything inside the graph.

`TranslationModule` holds the model, the SentencePiece model (tensorflow-text op) and the beam
search settings; `export_saved_model` writes it as `<export_dir>/<version>/` for TF Serving.
Signatures (all take `sentences`, string [B]):
  serving_default   -> translations string [B], scores float32 [B]       (best hypothesis)
  translate_n_best  -> translations string [B, N], scores float32 [B, N] (N = n_best, best first)

A sentence's translation does not depend on its batch-mates (TF Serving batches requests of
different clients together): its output limit is its own source length + 50 subwords. A request
is translated in chunks of at most `chunk_size` sentences, one after another, so its memory is
that of one chunk however many sentences it holds.
Defined results for awkward input: a sentence with no content (empty; only blanks, zero-width
or control characters; only invalid UTF-8) gets "" and score 0.0; a batch of 0 gives empty
outputs; invalid UTF-8 bytes become U+FFFD; a source longer than the model's max_length - 1
subwords is truncated to them (the rest is not translated); an input that is not a rank-1
string tensor is an InvalidArgument error.
"""
import logging
import os
import re
import shutil

import tensorflow as tf

from tfnmt.data.special_tokens import PAD_ID
from tfnmt.data.tokenizer import has_content, portable_model_proto, strip_output, to_source_ids
from tfnmt.inference.beam_search import beam_search
from tfnmt.inference.decoding import EXTRA_LENGTH, decode_limits
from tfnmt.layers.linear import low_precision_matmuls

MATMUL_DTYPES = ("float32", "bfloat16")

SIGNATURE_INPUT = "sentences"


class TranslationModule:
    """The model's translator as tf.functions (`serve`, `serve_n_best`); write it with
    `export_saved_model`.

    Args:
      model: a built `Transformer` (float32 weights).
      spm_model_proto: the serialized SentencePiece model (paths of the training machine are
        dropped).
      beam_size, alpha: beam search width and GNMT length-penalty exponent.
      max_decode_length: cap on output subwords (0: each source's length + `extra_length`).
      n_best: hypotheses returned by `serve_n_best`.
      parallel_searches: a chunk's sentences are split into this many groups, searched by
        independent loops in the graph, which the runtime runs at the same time. On a CPU one
        op of a search step seldom keeps every core busy (small tensors run on one thread), and
        a second search fills the gaps (CHANGELOG.md, "Measured gains of the speed-ups"); each
        sentence's result is the same. 1 for GPUs.
      matmul_dtype: "bfloat16" runs the model's weight matmuls (projections, feed-forward,
        output layer) in bfloat16 (`linear.low_precision_matmuls`), all else in float32:
        faster where bf16 is native (AMX, AVX512-BF16, recent GPUs), very slow where it is
        emulated; the translations differ slightly from float32's (bench/README.md).
      chunk_size: sentences searched at once; a larger request is translated in chunks of this
        many, one after another.

    Example:
      module = TranslationModule(model, open("spm.model", "rb").read())
      module.serve(tf.constant(["Das ist ein Haus."]))  # {"translations": ..., "scores": ...}
    """

    def __init__(self, model, spm_model_proto, beam_size=4, alpha=0.6, max_decode_length=0,
                 n_best=4, extra_length=EXTRA_LENGTH, parallel_searches=2,
                 matmul_dtype="float32", chunk_size=64):
        import tensorflow_text as tf_text

        self.model = model
        self.tokenizer = tf_text.SentencepieceTokenizer(
            model=portable_model_proto(spm_model_proto), out_type=tf.int32)
        self.beam_size, self.alpha, self.n_best = int(beam_size), float(alpha), int(n_best)
        self.max_decode_length, self.extra_length = int(max_decode_length), int(extra_length)
        self.max_source_length = int(model.max_length)
        if not 1 <= self.n_best <= self.beam_size:
            raise ValueError(f"n_best={n_best} must be in [1, beam_size={beam_size}]")
        self.parallel_searches = int(parallel_searches)
        if self.parallel_searches < 1:
            raise ValueError(f"parallel_searches={parallel_searches} must be >= 1")
        if matmul_dtype not in MATMUL_DTYPES:
            raise ValueError(f"matmul_dtype must be one of {MATMUL_DTYPES}, got {matmul_dtype!r}")
        self.matmul_dtype = matmul_dtype
        self.chunk_size = int(chunk_size)
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size={chunk_size} must be >= 1")

    def source_ids(self, sentences):
        """Model inputs of sentences.

        Args:
          sentences: [B] tf.string.

        Returns:
          [B, S] int32: tokenized, truncated, EOS-terminated, padded.
        """
        return self._tokenize(sentences)[1]

    def _tokenize(self, sentences):
        """string [B] -> (the text as valid UTF-8 [B], its source ids [B, S])."""
        text = tf.strings.unicode_transcode(sentences, "UTF-8", "UTF-8", errors="replace")
        return text, to_source_ids(self.tokenizer.tokenize(text), self.max_source_length)

    def translate_batch(self, sentences, n_best):
        """Translates sentences in chunks of at most `chunk_size`, one chunk after the other.

        Args:
          sentences: [B] tf.string.
          n_best: hypotheses per sentence.

        Returns:
          (translations [B, n_best] tf.string, scores [B, n_best] float32), best first; a sentence
          without content gives "" and 0.0.
        """
        sentences = _rank_1_strings(sentences)
        # Weight matrices (rank 2) cast once per call, before the loops.
        kernels = [v for v in self.model.trainable_variables if len(v.shape) == 2] \
            if self.matmul_dtype != "float32" else []
        with low_precision_matmuls(kernels, tf.as_dtype(self.matmul_dtype)):
            batch, size = tf.shape(sentences)[0], self.chunk_size
            count = (batch + size - 1) // size

            def translate_chunk(index, translations, scores):
                chunk = self._translate_chunk(sentences[index * size:(index + 1) * size],
                                              n_best)
                return (index + 1, translations.write(index, chunk[0]),
                        scores.write(index, chunk[1]))

            def results(dtype):
                return tf.TensorArray(dtype, size=count, element_shape=[None, n_best],
                                      infer_shape=False)

            # One chunk at a time (parallel_iterations=1): memory is that of one chunk.
            _, translations, scores = tf.while_loop(
                lambda index, *_: index < count, translate_chunk,
                (tf.constant(0), results(tf.string), results(tf.float32)),
                parallel_iterations=1)
            return translations.concat(), scores.concat()

    def _translate_chunk(self, sentences, n_best):
        """string [C] -> (translations string [C, n_best], scores float32 [C, n_best])."""
        text, source_ids = self._tokenize(sentences)
        source_lengths = tf.reduce_sum(tf.cast(tf.not_equal(source_ids, PAD_ID), tf.int32), 1)
        # No content: nothing left but EOS, or only blanks/format characters/U+FFFD. Searched
        # for one step only, and answered with "" and 0.
        content = tf.logical_and(source_lengths > 1, has_content(text))  # [C]
        limits = decode_limits(self.model, source_ids, extra=self.extra_length)
        if self.max_decode_length:
            limits = tf.minimum(limits, self.max_decode_length)
        limits = tf.where(content, limits, 1)
        ids, scores = self._search(source_ids, limits, n_best)  # [C, N, L], [C, N]
        batch, length = tf.shape(ids)[0], tf.shape(ids)[2]
        text = self.tokenizer.detokenize(strip_output(tf.reshape(ids, [batch * n_best, length])))
        text = tf.reshape(text, [batch, n_best])
        return (tf.where(content[:, None], text, ""),
                tf.where(content[:, None], scores, 0.0))

    def _search(self, source_ids, limits, n_best):
        """Beam search of source_ids [C, S] (limits [C]) in `parallel_searches` groups of
        consecutive rows (their sizes differ by at most one; some are empty when C is
        smaller)."""
        batch, groups = tf.shape(source_ids)[0], self.parallel_searches
        bounds = [(group * batch) // groups for group in range(groups + 1)]
        results = [beam_search(self.model, source_ids[start:end], self.beam_size, self.alpha,
                               limits[start:end], n_best)
                   for start, end in zip(bounds[:-1], bounds[1:])]
        if groups == 1:
            return results[0]
        length = tf.reduce_max([tf.shape(ids)[2] for ids, _ in results])
        ids = [tf.pad(ids, [[0, 0], [0, 0], [0, length - tf.shape(ids)[2]]],
                      constant_values=PAD_ID) for ids, _ in results]
        return tf.concat(ids, 0), tf.concat([scores for _, scores in results], 0)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=SIGNATURE_INPUT)])
    def serve(self, sentences):
        """The `serving_default` signature.

        Args:
          sentences: [B] tf.string.

        Returns:
          {"translations": [B] tf.string, "scores": [B] float32}.
        """
        translations, scores = self.translate_batch(sentences, 1)
        return {"translations": translations[:, 0], "scores": scores[:, 0]}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=SIGNATURE_INPUT)])
    def serve_n_best(self, sentences):
        """The `translate_n_best` signature.

        Args:
          sentences: [B] tf.string.

        Returns:
          {"translations": [B, n_best] tf.string, "scores": [B, n_best] float32}, best first.
        """
        translations, scores = self.translate_batch(sentences, self.n_best)
        return {"translations": translations, "scores": scores}


def _rank_1_strings(sentences):
    """sentences as a string tensor, checked at run time to be rank 1 [B]. The signature says
    [None], but a Session (TF Serving) feeds whatever a request holds; a static check would be
    folded away."""
    sentences = tf.convert_to_tensor(sentences, tf.string)
    rank = tf.raw_ops.Rank(input=sentences)
    check = tf.debugging.Assert(
        tf.equal(rank, 1), ["`sentences` must be a rank-1 string tensor [B]; got rank", rank])
    with tf.control_dependencies([check]):
        return tf.identity(sentences)


def next_version(export_dir):
    """The version number a new export gets.

    Args:
      export_dir: the directory of numbered versions (need not exist).

    Returns:
      One more than the largest version there, or 1.
    """
    versions = [int(n) for n in os.listdir(export_dir) if re.fullmatch(r"\d+", n)] \
        if os.path.isdir(export_dir) else []
    return max(versions, default=0) + 1


SIGNATURES = ("serving_default", "translate_n_best")
CHECK_SENTENCES = ("Guten Morgen!", "")


class ExportCheckError(RuntimeError):
    """The written SavedModel failed under TensorFlow's C++ loader (as TF Serving runs it)."""


def export_saved_model(module, export_dir, version=None, check=True):
    """Writes a new SavedModel version for TF Serving.

    The version is written under a temporary name and renamed when complete, so a watching
    TF Serving never loads half a model; an existing version is never overwritten.

    Args:
      module: a `TranslationModule`.
      export_dir: the directory of numbered versions.
      version: the version number; default the next integer.
      check: load the written model with TensorFlow's C++ loader, as TF Serving loads it,
        and translate CHECK_SENTENCES with both signatures before it is renamed into place.

    Returns:
      The version's path, `<export_dir>/<version>`.

    Raises:
      ExportCheckError: the check failed (the temporary directory is removed).
      FileExistsError: the version exists."""
    version = next_version(export_dir) if version is None else int(version)
    final = os.path.join(export_dir, str(version))
    if os.path.exists(final):
        raise FileExistsError(f"{final} exists; versions are never overwritten")
    os.makedirs(export_dir, exist_ok=True)
    remove_abandoned_exports(export_dir)
    temporary = os.path.join(export_dir, f".tmp-{version}-{os.getpid()}")
    try:
        write_saved_model(module, temporary)
        if check:
            check_with_session_loader(temporary)
        os.rename(temporary, final)
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
    """Writes the module's signatures as a SavedModel with Keras's exporter
    (`keras.export.ExportArchive`), which saves the variables the signatures read, once.
    (`tf.saved_model.save` of an object holding a Keras 3 model saves a copy of each variable,
    which TensorFlow's C++ loader restores while the graph reads the never-initialised originals:
    every TF Serving request would fail.)

    Args:
      module: a `TranslationModule`.
      path: the SavedModel directory to write.
    """
    import keras

    archive = keras.export.ExportArchive()
    archive.track(module.tokenizer)  # the SentencePiece model: a resource, not a variable
    archive.add_endpoint("serving_default", module.serve)
    archive.add_endpoint("translate_n_best", module.serve_n_best)
    archive.write_out(path, verbose=False)


def check_with_session_loader(path, sentences=CHECK_SENTENCES):
    """Loads a SavedModel with TensorFlow's C++ loader (`session_loader`), as TF Serving does, and
    runs each signature.

    Args:
      path: the SavedModel directory.
      sentences: the sentences to translate.

    Raises:
      ExportCheckError: the load failed, or a signature did not answer with a translation and a
        score per sentence.
    """
    import numpy as np

    from tfnmt.inference.session_loader import SessionLoaderError, SessionModel

    feed = {SIGNATURE_INPUT: np.array([s.encode() for s in sentences], object)}
    try:
        with SessionModel(path) as served:
            for name in SIGNATURES:
                out = served.run(name, feed)
                if {k: v.shape[:1] for k, v in out.items()} != \
                        {"translations": (len(sentences),), "scores": (len(sentences),)}:
                    raise ExportCheckError(f"{name} answered {len(sentences)} sentences with "
                                           f"{ {k: v.shape for k, v in out.items()} }")
    except SessionLoaderError as error:
        raise ExportCheckError(f"the export does not run under TensorFlow's C++ loader "
                               f"(TF Serving's): {error}") from error


def latest_export(path):
    """The SavedModel a path names.

    Args:
      path: an export version directory, or an export_dir of numbered versions.

    Returns:
      The version directory (the newest one under an export_dir).
    """
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return path
    version = next_version(path) - 1
    if version < 1:
        raise FileNotFoundError(f"{path} holds no SavedModel and no numbered version of one")
    return os.path.join(path, str(version))


def load_translate_fn(model_dir=None, export=None, beam_size=4, alpha=0.6, checkpoint="auto"):
    """A translation function from a model_dir's checkpoint or from an export.

    Args:
      model_dir: a training directory (used when `export` is not given).
      export: an export version directory, or an export_dir (its newest version).
      beam_size, alpha: beam settings for a model_dir (an export keeps its own).
      checkpoint: which checkpoint of the model_dir (`checkpoints.load_model`'s `which`).

    Returns:
      A function string [B] -> (translations string [B], scores float32 [B]).
    """
    if export:
        import tensorflow_text  # noqa: F401  registers the SentencePiece ops

        signature = tf.saved_model.load(latest_export(export)).signatures["serving_default"]

        def translate(sentences):
            out = signature(sentences=tf.constant(sentences, tf.string))
            return out["translations"], out["scores"]
        return translate
    from tfnmt.checkpoints import load_model

    model, proto, _ = load_model(model_dir, checkpoint)
    module = TranslationModule(model, proto, beam_size, alpha, n_best=1)

    def translate(sentences):
        out = module.serve(tf.constant(sentences, tf.string))
        return out["translations"], out["scores"]
    return translate
