"""The exported translator: raw strings in, translations out, everything inside the graph.

`TranslationModule` holds the model, its SentencePiece model(s) (tensorflow-text ops: one
shared, or one per side) and the beam search settings; `saved_model.export_saved_model` writes it
as `<export_dir>/<version>/` for TF Serving.
Signatures (all take `sentences`, string [B]):
  serving_default   -> translations string [B], scores float32 [B]       (best hypothesis)
  translate_n_best  -> translations string [B, N], scores float32 [B, N] (N = n_best, best first)
  translate_with_prefix (+ prefixes string [B]) -> as serving_default, each translation
                       starting with its prefix (its subwords forced, then beam search)
  score (+ targets string [B]) -> scores float32 [B]: log P(target | sentence) by forced
                       decoding, lengths int32 [B]: the target's subwords + EOS (`scoring`)

A sentence's translation does not depend on its batch-mates (TF Serving batches requests of
different clients together): its output limit is its own source length + 50 subwords. A request
is translated in chunks of at most `chunk_size` sentences, one after another, so its memory is
that of one chunk however many sentences it holds.
Defined results for awkward input: a sentence with no content (empty; only blanks, zero-width
or control characters; only invalid UTF-8) gets "" and score 0.0; a batch of 0 gives empty
outputs; invalid UTF-8 bytes become U+FFFD; a source longer than the model's max_length - 1
subwords is truncated to them (the rest is not translated; the export's `source_lengths`
function, not a signature, tells which are); an input that is not a rank-1 string tensor is an
InvalidArgument error.
"""
import contextlib

import tensorflow as tf

from tfnmt.data.special_tokens import PAD_ID
from tfnmt.data.tokenizer import has_content, portable_model_proto, strip_output, to_source_ids
from tfnmt.data.vocabulary import as_protos
from tfnmt.inference import search_memory
from tfnmt.inference.beam_search import STOP_RULES, beam_search, beam_search_alphas
from tfnmt.inference.decoding import EXTRA_LENGTH, decode_limits, dynamic_decode
from tfnmt.inference.decoding_threads import PARALLEL_SEARCHES
from tfnmt.inference.greedy_search import SamplingSearch
from tfnmt.inference.scoring import sequence_log_probs, target_arrays
from tfnmt.inference.serving_precision import CPUINFO, ENVIRON, SearchPrecision
from tfnmt.layers.linear import low_precision_matmuls
from tfnmt.tensorflow_start import NVIDIA_DEVICE_FILES

MATMUL_DTYPES = ("float32", "bfloat16", "auto")

SIGNATURE_INPUT = "sentences"
SCORE_TARGETS = "targets"  # the `score` signature's second input
PREFIXES = "prefixes"  # the `translate_with_prefix` signature's second input
# Device files of the GPUs TensorFlow runs on under Linux (NVIDIA's driver; AMD's ROCm), as a
# container sees them when its GPUs are passed in (`docker run --gpus ...`).
GPU_DEVICE_FILES = (NVIDIA_DEVICE_FILES, "/dev/kfd")


def search_bounds(batch, groups, gpu_files=GPU_DEVICE_FILES):
    """In the graph: the row bounds of a chunk's `groups` parallel searches.

    On a CPU, `groups` consecutive groups, group g of ceil((batch - g) / groups) rows: as many
    as `dealt_order` deals it (sizes differ by at most one; some empty when `batch` is
    smaller). Where one of `gpu_files` exists on the machine that runs the graph, all rows go
    to the first group and the others are empty: a GPU runs one search of the whole chunk
    faster than several searches of its parts. The files are looked for where the graph runs
    (a Python-side check would see the exporting machine).

    Args:
      batch: int32 scalar, the chunk's rows.
      groups: int, the number of searches (`parallel_searches`).
      gpu_files: glob patterns of GPU device files.

    Returns:
      A list of groups + 1 int32 scalars, from 0 to `batch`.
    """
    bounds = [0]
    for group in range(groups):
        bounds.append(bounds[-1] + (batch - group + groups - 1) // groups)
    if groups == 1 or not gpu_files:
        return bounds
    gpu = on_gpu(gpu_files)
    return [bounds[0]] + [tf.where(gpu, batch, bound) for bound in bounds[1:]]


def on_gpu(gpu_files=GPU_DEVICE_FILES):
    """In the graph: whether one of `gpu_files` (glob patterns) exists on the machine that runs
    it (a bool scalar; False for no patterns)."""
    return tf.reduce_any([False] + [tf.size(tf.io.matching_files(pattern)) > 0
                                    for pattern in gpu_files])


def dealt_order(lengths, groups):
    """In the graph: a permutation of a chunk's rows that deals them out to `groups` searches
    by length, as cards: the shortest to the first group, the next to the second, and so on;
    group g's rows, in order, are then the g-th of `search_bounds`. Each search gets sentences
    of every length, so the searches run for about as many steps and take about as long, and
    no core waits for the other's longest sentences (rows cut into consecutive halves can put
    the long ones in one search).

    Args:
      lengths: [C] int32, each row's search length limit.
      groups: int, the number of searches.

    Returns:
      [C] int32: the rows in the groups' order (`tf.gather(rows, order)`).
    """
    order = tf.argsort(lengths, stable=True)
    return tf.concat([order[group::groups] for group in range(groups)], 0)


class TranslationModule:
    """The model's translator as tf.functions (`serve`, `serve_n_best`); write it with
    `export_saved_model`.

    Args:
      model: a built `Transformer` (float32 weights).
      vocabulary: the serialized SentencePiece model of a shared vocabulary (bytes), or a
        `vocabulary.VocabularyProtos` (source, target) pair (`checkpoints.load_model` gives
        one); paths of the training machine are dropped.
      beam_size, alpha: beam search width and GNMT length-penalty exponent (a float; or a
        float32 tf.Variable, read by every search, for a module used in-process only).
      beam_stop: when a sentence's search ends before its limit: "finished" (once beam_size
        hypotheses have ended) or "bound" (once none left can beat them;
        `beam_search.STOP_RULES`).
      no_repeat_ngram_size: N > 0: no translation repeats an N-gram of subwords
        (`beam_search.BeamSearch`); 0 (default) allows it. Beam search only.
      max_decode_length: cap on output subwords (0: each source's length + `extra_length`).
      n_best: hypotheses returned by `serve_n_best`.
      parallel_searches: a chunk's sentences are split into this many groups, searched by
        independent loops in the graph, which the runtime runs at the same time. On a CPU one
        op of a search step seldom keeps every core busy (small tensors run on one thread), and
        a second search fills the gaps (CHANGELOG.md, "Measured gains of the speed-ups"); each
        sentence's result is the same. The `score` signature scores a chunk in as many groups.
        Where the machine that runs the graph has a GPU (`search_bounds`), a chunk is one
        group whatever this says.
      matmul_dtype: "bfloat16" runs the model's weight matmuls (projections, feed-forward,
        output layer) in bfloat16 (`linear.low_precision_matmuls`), all else in float32:
        faster with AMX and on recent GPUs, on some CPUs with AVX512-BF16 and not on others,
        very slow where bf16 is emulated; the translations differ slightly from float32's
        (bench/README.md). "auto" holds both searches and runs bfloat16 where the serving CPU
        has native bf16 and its first request times bf16 products faster
        (`serving_precision.SearchPrecision`), else float32; it looks at the CPU only, so
        choose explicitly for GPUs.
      chunk_size: sentences searched at once; a larger request is translated in chunks of this
        many, one after another.
      memory_budget: None, or bytes a chunk's search may hold: a request's chunks are then of
        as many sentences (at most chunk_size, at least 1) as fit in it by the estimate of
        `search_memory.sentence_bytes` for the request's longest sentence (a wide beam
        searches fewer sentences at once); for use in this process (translate.py and
        evaluate.py with a model_dir). Or `search_memory.SERVING_MACHINE` (export.py's):
        `search_memory.BUDGET_SHARE` of the memory available on the machine that runs the
        graph (`search_memory.available_bytes_in_graph`), no cap where that cannot be read
        or where the machine has a GPU (one of `gpu_files`: a GPU's search is in its own
        memory).
      sampling: None for beam search, or {"temperature", "top_k", "seed"}: each translation is
        drawn at random instead (`greedy_search.SamplingSearch`; n_best must be 1). The module
        numbers its searches (each chunk of each request), so that every one draws anew: a
        request of the same sentences twice gets other translations, and a new module with
        the same seed repeats the sequence.
      cpuinfo: the file an "auto" export reads its CPU flags from (tests give their own).
      environ: the file an "auto" export reads its process environment from (its
        ONEDNN_MAX_CPU_ISA; tests give their own).
      gpu_files: the device files whose presence means a GPU (`search_bounds`; tests give
        their own).
      memory_files: the (meminfo, cgroup) paths `SERVING_MACHINE`'s budget is read from
        (tests give their own).
      bf16_min_speedup: an "auto" export searches in bfloat16 where its products time at
        least this many times faster than float32's (default: training's threshold).

    Example:
      module = TranslationModule(model, open("spm.model", "rb").read())
      module.serve(tf.constant(["Das ist ein Haus."]))  # {"translations": ..., "scores": ...}
    """

    def __init__(self, model, vocabulary, beam_size=4, alpha=0.6, max_decode_length=0,
                 n_best=4, extra_length=EXTRA_LENGTH, parallel_searches=PARALLEL_SEARCHES,
                 matmul_dtype="float32", chunk_size=64, sampling=None, cpuinfo=CPUINFO,
                 beam_stop="finished", bf16_min_speedup=None, gpu_files=GPU_DEVICE_FILES,
                 environ=ENVIRON, memory_budget=None, no_repeat_ngram_size=0,
                 memory_files=(search_memory.MEMINFO, search_memory.CGROUP)):
        import tensorflow_text as tf_text

        self.model = model
        protos = as_protos(vocabulary)
        self.source_tokenizer = tf_text.SentencepieceTokenizer(
            model=portable_model_proto(protos.source), out_type=tf.int32)
        self.target_tokenizer = self.source_tokenizer if protos.shared else \
            tf_text.SentencepieceTokenizer(model=portable_model_proto(protos.target),
                                           out_type=tf.int32)
        self.beam_size, self.n_best = int(beam_size), int(n_best)
        # A tf.Variable is read at every search, so its value can change without a new trace.
        self.alpha = alpha if isinstance(alpha, tf.Variable) else float(alpha)
        self.max_decode_length, self.extra_length = int(max_decode_length), int(extra_length)
        self.max_source_length = int(model.max_length)
        if not 1 <= self.n_best <= self.beam_size:
            raise ValueError(f"n_best={n_best} must be in [1, beam_size={beam_size}]")
        if beam_stop not in STOP_RULES:
            raise ValueError(f"beam_stop must be one of {STOP_RULES}, got {beam_stop!r}")
        self.beam_stop = beam_stop
        self.no_repeat_ngram_size = int(no_repeat_ngram_size)
        if self.no_repeat_ngram_size < 0:
            raise ValueError(f"no_repeat_ngram_size={no_repeat_ngram_size} must be >= 0")
        self.parallel_searches = int(parallel_searches)
        if self.parallel_searches < 1:
            raise ValueError(f"parallel_searches={parallel_searches} must be >= 1")
        self.gpu_files = tuple(gpu_files)
        if matmul_dtype not in MATMUL_DTYPES:
            raise ValueError(f"matmul_dtype must be one of {MATMUL_DTYPES}, got {matmul_dtype!r}")
        self.matmul_dtype, self.precision = matmul_dtype, None
        if matmul_dtype == "auto":
            output_weights = max((v for v in model.trainable_variables if len(v.shape) == 2),
                                 key=lambda v: v.shape.num_elements())  # [V, D]
            speedup = {} if bf16_min_speedup is None else {"min_speedup": bf16_min_speedup}
            self.precision = SearchPrecision(output_weights, cpuinfo, environ=environ, **speedup)
        self.chunk_size = int(chunk_size)
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size={chunk_size} must be >= 1")
        self.memory_budget = memory_budget if memory_budget in (
            None, search_memory.SERVING_MACHINE) else int(memory_budget)
        self.memory_files = tuple(memory_files)
        if sampling is not None:
            if self.n_best != 1:
                raise ValueError("sampling draws one translation per sentence: n_best must be 1")
            if self.no_repeat_ngram_size:
                raise ValueError("no_repeat_ngram_size applies to beam search, not sampling")
            SamplingSearch(model.settings["target_vocab_size"], **sampling)  # checks them
        self.sampling = sampling
        # The number of the next sampling search (`SamplingSearch`'s `search`).
        self.sampling_searches = None if sampling is None else tf.Variable(
            0, dtype=tf.int64, trainable=False, name="sampling_searches")
        # What an export's searches multiply by, kept as variables (`linear.kept_copies`;
        # made by `saved_model.write_saved_model`).
        self.decoding_copies = {}

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
        return text, to_source_ids(self.source_tokenizer.tokenize(text), self.max_source_length)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=SIGNATURE_INPUT)],
                 autograph=False)
    def source_lengths(self, sentences):
        """How much of each sentence the model reads: a function of the export, not a
        signature (translate.py and evaluate.py name the lines read in part).

        Args:
          sentences: [B] tf.string.

        Returns:
          {"subwords": [B] int32, each sentence's subwords; "max_subwords": int32 scalar, the
          most the model reads of a sentence (max_length - 1, then EOS): the rest of a longer
          one is not translated}.
        """
        text = tf.strings.unicode_transcode(sentences, "UTF-8", "UTF-8", errors="replace")
        subwords = tf.cast(self.source_tokenizer.tokenize(text).row_lengths(), tf.int32)
        return {"subwords": subwords, "max_subwords": tf.constant(self.max_source_length - 1)}

    def translate_batch(self, sentences, n_best, prefixes=None, alphas=None):
        """Translates sentences in chunks of at most `chunk_size`, one chunk after the other.

        Args:
          sentences: [B] tf.string.
          n_best: hypotheses per sentence.
          prefixes: [B] tf.string or None: the text each translation must start with ("" for
            none); its subwords are forced, then the search goes on.
          alphas: None, or M length-penalty exponents: the best translation under each, from
            one beam search (`beam_search.AlphaGridBeamSearch`); n_best must be 1.

        Returns:
          (translations [B, n_best] tf.string, scores [B, n_best] float32), best first; a sentence
          without content gives "" and 0.0. With alphas, [B, M]: column m under alphas[m].
        """
        sentences = _rank_1_strings(sentences)
        if prefixes is not None:
            sentences, prefixes = _as_many(sentences, prefixes, PREFIXES)
        if alphas is not None and (n_best != 1 or self.sampling is not None):
            raise ValueError("a search under several alphas is a beam search for n_best=1")
        columns = n_best if alphas is None else len(alphas)
        return self._in_chunks(
            lambda rows, prefix_rows: self._translate_chunk(rows, n_best, prefix_rows, alphas),
            [sentences, prefixes], [(tf.string, [None, columns]), (tf.float32, [None, columns])],
            self._search_chunk_size(sentences, prefixes))

    def _search_chunk_size(self, sentences, prefixes=None):
        """Sentences of `sentences` [B] (with `prefixes` [B] or None) to search at once:
        `chunk_size`, or with a `memory_budget`, as many as fit in it (int32 scalar, >= 1)."""
        if self.memory_budget is None:
            return self.chunk_size
        _, source_ids = self._tokenize(sentences)
        prefix = None if prefixes is None else self._prefix_ids(prefixes)
        limits = self._output_limits(source_ids, prefix)  # [B]
        longest = tf.cast(tf.reduce_max(tf.concat([limits, [1]], 0)), tf.int64)
        rows = 1 if self.sampling is not None else self.beam_size
        budget = self.memory_budget
        uncapped = tf.constant(False)
        if budget == search_memory.SERVING_MACHINE:
            available = search_memory.available_bytes_in_graph(*self.memory_files)
            budget = tf.cast(tf.cast(available, tf.float64) * search_memory.BUDGET_SHARE,
                             tf.int64)
            uncapped = tf.logical_or(available < 0, on_gpu(self.gpu_files))
        fit = budget // search_memory.sentence_bytes(self.model.settings, rows, longest)
        fit = tf.where(uncapped, tf.constant(self.chunk_size, tf.int64), fit)
        return tf.cast(tf.clip_by_value(fit, 1, self.chunk_size), tf.int32)

    def _prefix_ids(self, prefixes):
        """string [B] -> [B, P] int32 target subword ids of each prefix, PAD-padded."""
        text = tf.strings.unicode_transcode(prefixes, "UTF-8", "UTF-8", errors="replace")
        return tf.cast(self.target_tokenizer.tokenize(text), tf.int32).to_tensor(PAD_ID)

    def _output_limits(self, source_ids, prefix=None):
        """Each sentence's output limit: its source's length (EOS included) + `extra_length`,
        at most `max_decode_length`, raised to hold a forced prefix and one more subword.

        Args:
          source_ids: [B, S] int32.
          prefix: None, or [B, P] int32 subword ids, PAD-padded.

        Returns:
          [B] int32, at least 1, within a learned position table.
        """
        limits = decode_limits(self.model, source_ids, extra=self.extra_length)
        if self.max_decode_length:
            limits = tf.minimum(limits, self.max_decode_length)
        if prefix is not None:
            prefix_lengths = tf.reduce_sum(tf.cast(tf.not_equal(prefix, PAD_ID), tf.int32), 1)
            limits = tf.maximum(limits, prefix_lengths + 1)
            if self.model.settings["position"] == "learned":
                limits = tf.minimum(limits, self.model.settings["max_length"])
        return limits

    def _in_chunks(self, chunk_fn, inputs, outputs, size=None):
        """Runs `chunk_fn` on `size` consecutive rows of every input at a time, one chunk
        after the other (parallel_iterations=1: memory is that of one chunk), with the
        weight matmuls in `matmul_dtype` (for "auto", chosen when the graph runs).

        Args:
          chunk_fn: a function of each input's rows (None for a None input) -> its results.
          inputs: [B, ...] tensors (or None), the first one not None.
          outputs: (dtype, element shape) of each result.
          size: rows per chunk, an int or int32 scalar tensor (default `chunk_size`).

        Returns:
          The results of all chunks, concatenated.
        """
        size = self.chunk_size if size is None else size

        def all_chunks(matmul_dtype):
            with self.decoding_scope(matmul_dtype):
                batch = tf.shape(inputs[0])[0]
                count = (batch + size - 1) // size

                def one_chunk(index, *arrays):
                    rows = slice(index * size, (index + 1) * size)
                    results = chunk_fn(*[None if x is None else x[rows] for x in inputs])
                    return (index + 1,) + tuple(a.write(index, r)
                                                for a, r in zip(arrays, results))

                arrays = tuple(tf.TensorArray(dtype, size=count, element_shape=shape,
                                              infer_shape=False) for dtype, shape in outputs)
                _, *arrays = tf.while_loop(lambda index, *_: index < count, one_chunk,
                                           (tf.constant(0),) + arrays, parallel_iterations=1)
                return tuple(a.concat() for a in arrays)

        if self.matmul_dtype != "auto":
            return all_chunks(self.matmul_dtype)
        return tuple(tf.cond(self.precision.prefers_bf16(),
                             lambda: all_chunks("bfloat16"), lambda: all_chunks("float32")))

    @contextlib.contextmanager
    def decoding_scope(self, matmul_dtype):
        """The scope of a call's searches with weight matmuls in `matmul_dtype`: the weight
        matrices (rank 2) cast to it once per call, before the loop (`low_precision_matmuls`),
        and the model's `decoding_products`, also prepared once per call, however many chunks
        and parallel searches (or once per export, inside `linear.kept_copies`)."""
        kernels = [v for v in self.model.trainable_variables if len(v.shape) == 2] \
            if matmul_dtype != "float32" else []
        with low_precision_matmuls(kernels, tf.as_dtype(matmul_dtype)), \
                self.model.decoding_products():
            yield

    def search_dtypes(self):
        """The matmul dtypes the module searches in: both for "auto"."""
        return ("bfloat16", "float32") if self.matmul_dtype == "auto" else (self.matmul_dtype,)

    def _translate_chunk(self, sentences, n_best, prefixes=None, alphas=None):
        """string [C] (and prefixes [C]) -> (translations string [C, n_best], scores float32
        [C, n_best]); with alphas, [C, M] (`translate_batch`)."""
        text, source_ids = self._tokenize(sentences)
        prefix = None if prefixes is None else self._prefix_ids(prefixes)  # [C, P]
        source_lengths = tf.reduce_sum(tf.cast(tf.not_equal(source_ids, PAD_ID), tf.int32), 1)
        # No content: nothing left but EOS, or only blanks/format characters/U+FFFD. Searched
        # for one step only, and answered with "" and 0.
        content = tf.logical_and(source_lengths > 1, has_content(text))  # [C]
        limits = self._output_limits(source_ids, prefix)
        limits = tf.where(content, limits, 1)
        ids, scores = self._search(source_ids, limits, n_best, prefix, alphas)  # [C, N, L]
        columns = n_best if alphas is None else len(alphas)
        batch, length = tf.shape(ids)[0], tf.shape(ids)[2]
        text = self.target_tokenizer.detokenize(
            strip_output(tf.reshape(ids, [batch * columns, length])))
        text = tf.reshape(text, [batch, columns])
        return (tf.where(content[:, None], text, ""),
                tf.where(content[:, None], scores, 0.0))

    def _search(self, source_ids, limits, n_best, prefix=None, alphas=None):
        """Beam search of source_ids [C, S] (limits [C], prefix [C, P] or None) in
        `parallel_searches` groups (their sizes differ by at most one; some are empty when C is
        smaller), the rows dealt out by length (`dealt_order`); or sampling, of all rows at
        once. -> (ids [C, N, L], scores [C, N]); with alphas, [C, M, L] and [C, M]: each
        alpha's best."""
        if self.sampling is not None:
            number = self.sampling_searches.assign_add(1) - 1  # this search's
            strategy = SamplingSearch(self.model.settings["target_vocab_size"], **self.sampling,
                                      search=number, prefix=prefix)
            ids, scores = dynamic_decode(self.model, strategy, source_ids, limits)
            return ids[:, None], scores[:, None]
        def search(source_ids, limits, prefix):
            if alphas is None:
                return beam_search(self.model, source_ids, self.beam_size, self.alpha, limits,
                                   n_best, prefix=prefix, stop=self.beam_stop,
                                   no_repeat_ngram_size=self.no_repeat_ngram_size)
            ids, scores = beam_search_alphas(self.model, source_ids, alphas, self.beam_size,
                                             limits, prefix=prefix, stop=self.beam_stop,
                                             no_repeat_ngram_size=self.no_repeat_ngram_size)
            return ids[:, :, 0], scores[:, :, 0]  # n_best 1

        if self.parallel_searches == 1:
            return self._in_groups(search, source_ids, limits, prefix)[0]
        order = dealt_order(limits, self.parallel_searches)
        results = self._in_groups(search, *(None if rows is None else tf.gather(rows, order)
                                             for rows in (source_ids, limits, prefix)))
        length = tf.reduce_max([tf.shape(ids)[2] for ids, _ in results])
        ids = [tf.pad(ids, [[0, 0], [0, 0], [0, length - tf.shape(ids)[2]]],
                      constant_values=PAD_ID) for ids, _ in results]
        back = tf.math.invert_permutation(order)  # the rows in the chunk's order again
        return (tf.gather(tf.concat(ids, 0), back),
                tf.gather(tf.concat([scores for _, scores in results], 0), back))

    def _in_groups(self, function, *rows):
        """[function(*group's rows)] for the `parallel_searches` groups of consecutive rows of
        `rows` (tensors of C rows, or None, passed as None), whose sizes differ by at most one
        (some are empty when C is smaller; one group where a GPU runs the graph,
        `search_bounds`). The groups are independent: a CPU server's inter-op threads run them
        side by side."""
        bounds = search_bounds(tf.shape(rows[0])[0], self.parallel_searches, self.gpu_files)
        if not tf.executing_eagerly():
            # One function called once per group: the graph holds its work once, however
            # many groups run it (a search with two: a quarter less export time, a 40%
            # smaller graph).
            function = tf.function(function, autograph=False)
        return [function(*(None if r is None else r[start:end] for r in rows))
                for start, end in zip(bounds[:-1], bounds[1:])]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=SIGNATURE_INPUT)],
                 autograph=False)
    def serve(self, sentences):
        """The `serving_default` signature: the first column of `serve_n_best`, whose
        search (n_best only slices its end) an export then holds and traces once for both.

        Args:
          sentences: [B] tf.string.

        Returns:
          {"translations": [B] tf.string, "scores": [B] float32}.
        """
        best = self.serve_n_best(sentences)
        return {"translations": best["translations"][:, 0], "scores": best["scores"][:, 0]}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=SIGNATURE_INPUT),
                                  tf.TensorSpec([None], tf.string, name=PREFIXES)],
                 autograph=False)
    def serve_with_prefix(self, sentences, prefixes):
        """The `translate_with_prefix` signature: translations that start with given text.

        Args:
          sentences: [B] tf.string.
          prefixes: [B] tf.string, the start of each translation ("" for none).

        Returns:
          {"translations": [B] tf.string, "scores": [B] float32}.
        """
        translations, scores = self.translate_batch(sentences, 1, prefixes)
        return {"translations": translations[:, 0], "scores": scores[:, 0]}

    def score_batch(self, sentences, targets):
        """Forced decoding (`scoring`): each target's log-probability as a translation of its
        sentence, in chunks of at most `chunk_size`.

        Args:
          sentences: [B] tf.string, the sources.
          targets: [B] tf.string, their translations (cut to max_length - 1 subwords).

        Returns:
          (log-probabilities [B] float32, lengths [B] int32: the target's subwords + EOS).
        """
        sentences, targets = _as_many(_rank_1_strings(sentences), targets, SCORE_TARGETS)
        return self._in_chunks(self._score_chunk, [sentences, targets],
                               [(tf.float32, [None]), (tf.int32, [None])])

    def _score_chunk(self, sentences, targets):
        """string [C], [C] -> (log-probabilities [C] float32, lengths [C] int32), scored in
        `parallel_searches` groups of consecutive rows, as searched: independent passes that
        a server's inter-op threads run side by side (one group where a GPU serves)."""
        _, source_ids = self._tokenize(sentences)
        text = tf.strings.unicode_transcode(targets, "UTF-8", "UTF-8", errors="replace")
        target_in, target_out = target_arrays(self.target_tokenizer.tokenize(text),
                                              self.max_source_length)
        if self.parallel_searches == 1:
            return sequence_log_probs(self.model, source_ids, target_in, target_out)
        parts = self._in_groups(lambda *group: sequence_log_probs(self.model, *group),
                                source_ids, target_in, target_out)
        return tuple(tf.concat(part, 0) for part in zip(*parts))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=SIGNATURE_INPUT),
                                  tf.TensorSpec([None], tf.string, name=SCORE_TARGETS)],
                 autograph=False)
    def score(self, sentences, targets):
        """The `score` signature (forced decoding).

        Args:
          sentences: [B] tf.string, the sources.
          targets: [B] tf.string, their translations.

        Returns:
          {"scores": [B] float32 log P(target | source), "lengths": [B] int32 subwords + EOS}.
        """
        scores, lengths = self.score_batch(sentences, targets)
        return {"scores": scores, "lengths": lengths}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=SIGNATURE_INPUT)],
                 autograph=False)
    def serve_n_best(self, sentences):
        """The `translate_n_best` signature.

        Args:
          sentences: [B] tf.string.

        Returns:
          {"translations": [B, n_best] tf.string, "scores": [B, n_best] float32}, best first.
        """
        translations, scores = self.translate_batch(sentences, self.n_best)
        return {"translations": translations, "scores": scores}


def _as_many(sentences, others, name):
    """(sentences, others as a rank-1 string tensor), checked at run time to hold as many
    strings (InvalidArgument otherwise)."""
    others = _rank_1_strings(others, name)
    check = tf.debugging.Assert(
        tf.equal(tf.size(sentences), tf.size(others)),
        [f"`sentences` and `{name}` must hold as many strings:", tf.size(sentences),
         tf.size(others)])
    with tf.control_dependencies([check]):
        return tf.identity(sentences), others


def _rank_1_strings(sentences, name=SIGNATURE_INPUT):
    """sentences as a string tensor, checked at run time to be rank 1 [B]. The signature says
    [None], but a Session (TF Serving) feeds whatever a request holds. A check of the rank the
    graph knows would be folded away (TensorFlow's graph optimizer takes rank 1 from the
    signature): the rank checked is that of the sentences reshaped to their own shape, read
    where the optimizer cannot tell its length."""
    sentences = tf.convert_to_tensor(sentences, tf.string)
    shape = tf.shape(sentences)
    unknown_rank = tf.reshape(sentences, tf.boolean_mask(shape, shape >= 0))
    rank = tf.raw_ops.Rank(input=unknown_rank)
    check = tf.debugging.Assert(
        tf.equal(rank, 1), [f"`{name}` must be a rank-1 string tensor [B]; got rank", rank])
    with tf.control_dependencies([check]):
        return tf.identity(sentences)
