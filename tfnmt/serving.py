"""The exported translator: raw strings in, translations out, everything inside the graph.

`TranslationModule` holds the model, the SentencePiece model (tensorflow-text op) and the beam
search settings; `export_saved_model` writes it as `<export_dir>/<version>/` for TF Serving.
Signatures (all take `sentences`, string [B]):
  serving_default   -> translations string [B], scores float32 [B]       (best hypothesis)
  translate_n_best  -> translations string [B, N], scores float32 [B, N] (N = n_best, best first)
Defined results for awkward input: an empty (or all-space) sentence gets "" and score 0.0; a
batch of 0 gives empty outputs; invalid UTF-8 bytes become U+FFFD; a source longer than the
model's max_length - 1 subwords is truncated to them (the rest is not translated).
"""
import os
import re

import tensorflow as tf

from tfnmt.beam_search import beam_search
from tfnmt.layers.linear import low_precision_matmuls
from tfnmt.tokenizer import PAD_ID, strip_output, to_source_ids

MATMUL_DTYPES = ("float32", "bfloat16")

SIGNATURE_INPUT = "sentences"


class TranslationModule(tf.Module):
    """`parallel_searches`: a batch's sentences are split into this many groups, searched by
    independent loops in the graph, which the runtime runs at the same time. On a CPU one op of
    a search step seldom keeps every core busy (small tensors run on one thread), and a second
    search fills the gaps (bench/README.md); each sentence's result is the same. 1 for GPUs.

    `matmul_dtype` "bfloat16": the model's weight matmuls (projections, feed-forward, output
    layer) run in bfloat16 (`linear.low_precision_matmuls`), all else in float32: faster where
    bf16 is native (AMX, AVX512-BF16, recent GPUs), very slow where it is emulated; the
    translations differ slightly from float32's (bench/README.md)."""

    def __init__(self, model, spm_model_proto, beam_size=4, alpha=0.6, max_decode_length=0,
                 n_best=4, extra_length=50, parallel_searches=2, matmul_dtype="float32"):
        super().__init__(name="translator")
        import tensorflow_text as tf_text

        self.model = model
        self.tokenizer = tf_text.SentencepieceTokenizer(model=spm_model_proto, out_type=tf.int32)
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

    def source_ids(self, sentences):
        """string [B] -> ids [B, S] int32: tokenized, truncated, EOS-terminated, padded."""
        sentences = tf.strings.unicode_transcode(sentences, "UTF-8", "UTF-8", errors="replace")
        return to_source_ids(self.tokenizer.tokenize(sentences), self.max_source_length)

    def _decode_length(self, source_ids):
        lengths = tf.reduce_sum(tf.cast(tf.not_equal(source_ids, PAD_ID), tf.int32), axis=1)
        limit = tf.reduce_max(tf.concat([lengths, [0]], 0)) + self.extra_length
        if self.max_decode_length:
            limit = tf.minimum(limit, self.max_decode_length)
        if self.model.settings["position"] == "learned":  # no position beyond the table
            limit = tf.minimum(limit, self.max_source_length)
        return limit

    def translate_batch(self, sentences, n_best):
        """-> (translations string [B, n_best], scores float32 [B, n_best])."""
        sentences = tf.convert_to_tensor(sentences, tf.string)
        source_ids = self.source_ids(sentences)
        # Weight matrices (rank 2) cast once per call, before the searches' loops.
        kernels = [v for v in self.model.trainable_variables if len(v.shape) == 2] \
            if self.matmul_dtype != "float32" else []
        with low_precision_matmuls(kernels, tf.as_dtype(self.matmul_dtype)):
            ids, scores = self._search(source_ids, n_best)  # [B, N, L], [B, N]
        batch, length = tf.shape(ids)[0], tf.shape(ids)[2]
        text = self.tokenizer.detokenize(strip_output(tf.reshape(ids, [batch * n_best, length])))
        text = tf.reshape(text, [batch, n_best])
        empty = tf.equal(tf.strings.strip(sentences), "")[:, None]  # [B, 1]
        return tf.where(empty, "", text), tf.where(empty, 0.0, scores)

    def _search(self, source_ids, n_best):
        """Beam search of source_ids [B, S] in `parallel_searches` groups of consecutive rows
        (their sizes differ by at most one; some are empty when B is smaller), all to the whole
        batch's maximum length."""
        max_length = self._decode_length(source_ids)
        batch, groups = tf.shape(source_ids)[0], self.parallel_searches
        bounds = [(group * batch) // groups for group in range(groups + 1)]
        results = [beam_search(self.model, source_ids[start:end], self.beam_size, self.alpha,
                               max_length, n_best)
                   for start, end in zip(bounds[:-1], bounds[1:])]
        if groups == 1:
            return results[0]
        length = tf.reduce_max([tf.shape(ids)[2] for ids, _ in results])
        ids = [tf.pad(ids, [[0, 0], [0, 0], [0, length - tf.shape(ids)[2]]],
                      constant_values=PAD_ID) for ids, _ in results]
        return tf.concat(ids, 0), tf.concat([scores for _, scores in results], 0)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=SIGNATURE_INPUT)])
    def serve(self, sentences):
        translations, scores = self.translate_batch(sentences, 1)
        return {"translations": translations[:, 0], "scores": scores[:, 0]}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=SIGNATURE_INPUT)])
    def serve_n_best(self, sentences):
        translations, scores = self.translate_batch(sentences, self.n_best)
        return {"translations": translations, "scores": scores}


def next_version(export_dir):
    versions = [int(n) for n in os.listdir(export_dir) if re.fullmatch(r"\d+", n)] \
        if os.path.isdir(export_dir) else []
    return max(versions, default=0) + 1


def export_saved_model(module, export_dir, version=None):
    """Writes `<export_dir>/<version>/` (default: the next integer) under a temporary name and
    renames it when complete, so a watching TF Serving never loads half a model. An existing
    version is never overwritten. Returns the path."""
    version = next_version(export_dir) if version is None else int(version)
    final = os.path.join(export_dir, str(version))
    if os.path.exists(final):
        raise FileExistsError(f"{final} exists; versions are never overwritten")
    os.makedirs(export_dir, exist_ok=True)
    temporary = os.path.join(export_dir, f".tmp-{version}-{os.getpid()}")
    signatures = {"serving_default": module.serve, "translate_n_best": module.serve_n_best}
    tf.saved_model.save(module, temporary, signatures=signatures)
    os.rename(temporary, final)
    return final


def latest_export(path):
    """An export version directory, or the newest version under an export_dir."""
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return path
    version = next_version(path) - 1
    if version < 1:
        raise FileNotFoundError(f"{path} holds no SavedModel and no numbered version of one")
    return os.path.join(path, str(version))


def load_translate_fn(model_dir=None, export=None, beam_size=4, alpha=0.6, checkpoint="auto"):
    """A function string [B] -> (translations string [B], scores float32 [B]) from a training
    directory's checkpoint (beam settings as given) or from an export (its own settings)."""
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
