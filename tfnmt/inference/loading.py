"""Translators loaded for use in Python: from a model_dir's checkpoint (a `TranslationModule`
built on the spot), from a SavedModel export (its signatures) or from a CTranslate2 export
(`ctranslate2_translator`), behind the same functions. TensorFlow is imported only to load a
checkpoint or a SavedModel."""
import os

from tfnmt import text_lines
from tfnmt.inference import search_memory
from tfnmt.inference.decoding_threads import (PARALLEL_SEARCHES, export_searches, gpu_present,
                                              use_decoding_threads)
from tfnmt.paths import DamagedFileError, is_ctranslate2, latest_export


def share_threads(export=None, sampling=None):
    """Shares this process's CPU threads out among the parallel searches of what will translate
    (`decoding_threads.use_decoding_threads`): an export's recorded number, or a model_dir's
    `TranslationModule` (one search when sampling). Effective only before TensorFlow first runs
    in the process: call it before anything else uses TensorFlow.

    Args:
      export: an export version directory or export_dir; None for a model_dir.
      sampling: for a model_dir, whether translations are drawn at random.

    Returns:
      (intra-op threads, inter-op threads) as set, or None when left as they were.
    """
    if not export:
        return use_decoding_threads(1 if sampling else PARALLEL_SEARCHES)
    if is_ctranslate2(export):  # CTranslate2 has threads of its own
        return None
    try:
        version = latest_export(export)
    except FileNotFoundError:  # loading it names the problem
        return None
    return use_decoding_threads(export_searches(version))


def skip_graph_rewrites(export=None, gpu_files=None):
    """Turns TensorFlow's graph rewrites (Grappler) off for this process's later functions, on
    a CPU: a translation program's searches run as traced or as exported. Rewriting a search's
    graph takes seconds at its first call and made the searches no faster on a CPU (same
    translations, 2-3 s less per translate.py process on 2 cores; docs/serving.md). TF
    Serving keeps its own settings.

    Call it in a program's process only: the setting stays for the rest of the process.

    Args:
      export: the model translate.py or evaluate.py was given (a CTranslate2 model: nothing to
        do, and TensorFlow is not imported).
      gpu_files: glob patterns of GPU device files; where one exists, the rewrites stay
        (`serving.GPU_DEVICE_FILES` by default).

    Returns:
      Whether the rewrites were turned off.
    """
    if export and is_ctranslate2(export):
        return False
    if gpu_files is None:
        from tfnmt.inference.serving import GPU_DEVICE_FILES as gpu_files
    if gpu_present(gpu_files):
        return False
    import tensorflow as tf

    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    return True


def load_translate_fn(model_dir=None, export=None, beam_size=4, alpha=None, checkpoint="auto",
                      beam_stop="finished", no_repeat_ngram_size=None):
    """A translation function from a model_dir's checkpoint or from an export.

    Args:
      model_dir: a training directory (used when `export` is not given).
      export: an export version directory, or an export_dir (its newest version).
      beam_size, alpha, beam_stop, no_repeat_ngram_size: beam settings for a model_dir (an
        export keeps its own); alpha and no_repeat_ngram_size None: the model_dir's
        (`length_penalty.default_alpha`, `default_no_repeat`).
      checkpoint: which checkpoint of the model_dir (`checkpoints.load_model`'s `which`).

    Returns:
      A function string [B] -> (translations string [B], scores float32 [B]).
    """
    return load_signatures(model_dir, export, beam_size, alpha, checkpoint,
                           beam_stop=beam_stop,
                           no_repeat_ngram_size=no_repeat_ngram_size)["serving_default"]


def load_signatures(model_dir=None, export=None, beam_size=4, alpha=None, checkpoint="auto",
                    n_best=1, sampling=None, beam_stop="finished", no_repeat_ngram_size=None):
    """The translator's signatures as Python functions, from a model_dir's checkpoint or from
    an export (the signatures it has).

    Args:
      model_dir: a training directory (used when `export` is not given).
      export: an export version directory, or an export_dir (its newest version); or a
        CTranslate2 model directory (`ctranslate2_translator.load_signatures`, which takes
        beam_size, alpha, n_best, sampling and no_repeat_ngram_size).
      beam_size, alpha, n_best, beam_stop, no_repeat_ngram_size: beam settings for a
        model_dir (a SavedModel keeps its own); alpha None: the model_dir's
        (`length_penalty.default_alpha`); no_repeat_ngram_size None: the model_dir's (or the
        CTranslate2 model's) for a beam search (`length_penalty.default_no_repeat`), else 0.
      checkpoint: which checkpoint of the model_dir (`checkpoints.load_model`'s `which`).
      sampling: for a model_dir or a CTranslate2 model, draw translations at random
        (`TranslationModule`'s).

    In a process where TensorFlow has not run yet, its CPU threads are first shared out among
    the parallel searches (`share_threads`).

    Returns:
      {"serving_default": sentences -> (translations [B], scores [B]),
       "translate_n_best": sentences -> (translations [B, N], scores [B, N]),
       "translate_with_prefix": (sentences, prefixes) -> (translations [B], scores [B]),
       "score": (sentences, targets) -> (log-probabilities [B], lengths [B]),
       "source_lengths": sentences -> (subwords [B] numpy, the most the model reads)}, each
      taking lists of str (an export has those of them it was exported with).

    A model_dir's searches take as many sentences at once as fit in half the memory
    available (`search_memory`).

    Raises:
      FileNotFoundError: `export` holds no SavedModel.
      DamagedFileError: the export's files do not load (cut short, or missing).
      ctranslate2_translator.CTranslate2ModelError: a CTranslate2 model without tfnmt.json.
      checkpoints.ModelDirError: the model_dir has no model that reads back.
      search_memory.SearchMemoryError: a beam of which one sentence's search does not fit in
        this machine's memory.
    """
    if export and is_ctranslate2(export):
        from tfnmt.inference import ctranslate2_translator

        return ctranslate2_translator.load_signatures(
            export, beam_size, alpha, n_best=n_best, sampling=sampling,
            no_repeat_ngram_size=no_repeat_ngram_size)
    import tensorflow as tf

    if export:
        import tensorflow_text  # noqa: F401  registers the SentencePiece ops

        version = latest_export(export)
        share_threads(export=version)
        try:
            loaded = tf.saved_model.load(version)
        except (tf.errors.OpError, OSError, IndexError, ValueError) as error:
            # A cut or missing file: TensorFlow's message, without its advice on devices.
            raise DamagedFileError(f"{version} does not load as a SavedModel: "
                                   f"{str(error).strip().splitlines()[0]}") from None
        _check_translation_export(version, loaded)
        run = {name: _from_strings(loaded.signatures[name]) for name in loaded.signatures}
        if hasattr(loaded, "source_lengths"):  # exports made before it lack it
            run["source_lengths"] = _from_strings(loaded.source_lengths, loaded)
    else:
        from tfnmt.checkpoints import load_model
        from tfnmt.inference.length_penalty import default_alpha, default_no_repeat
        from tfnmt.inference.serving import TranslationModule

        share_threads(sampling=sampling)
        model, vocab, _ = load_model(model_dir, checkpoint)
        available = search_memory.available_bytes()  # None: not known, no cap
        budget = None if available is None else search_memory.memory_budget(available)
        if sampling is None and available is not None:
            search_memory.check_beam(model.settings, beam_size, available=available)
        alpha = default_alpha(model_dir)[0] if alpha is None else alpha
        if no_repeat_ngram_size is None:  # a beam search rule: sampling draws without it
            no_repeat_ngram_size = 0 if sampling else default_no_repeat(model_dir)[0]
        module = TranslationModule(model, vocab, beam_size, alpha, n_best=n_best,
                                   sampling=sampling, beam_stop=beam_stop,
                                   no_repeat_ngram_size=no_repeat_ngram_size,
                                   memory_budget=budget)
        # A tf.function method holds its instance weakly: the functions keep `module` alive.
        run = {"serving_default": _from_strings(module.serve, module),
               "translate_n_best": _from_strings(module.serve_n_best, module),
               "translate_with_prefix": _from_strings(module.serve_with_prefix, module),
               "score": _from_strings(module.score, module),
               "source_lengths": _from_strings(module.source_lengths, module)}

    def translate(name):
        def call(sentences):
            out = run[name](sentences=sentences)
            return out["translations"], out["scores"]
        return call

    def with_prefix(sentences, prefixes):
        out = run["translate_with_prefix"](sentences=sentences, prefixes=prefixes)
        return out["translations"], out["scores"]

    def score(sentences, targets):
        out = run["score"](sentences=sentences, targets=targets)
        return out["scores"], out["lengths"]

    def source_lengths(sentences):
        out = run["source_lengths"](sentences=sentences)
        return out["subwords"].numpy(), int(out["max_subwords"])

    functions = {name: translate(name) for name in ("serving_default", "translate_n_best")
                 if name in run}
    for name, function in (("translate_with_prefix", with_prefix), ("score", score),
                           ("source_lengths", source_lengths)):
        if name in run:  # exports made before these existed lack them
            functions[name] = function
    return functions


def load_errors(export=None):
    """The errors `load_signatures` raises for a model that cannot translate (the programs say
    each in one line); for a CTranslate2 `export`, known without importing TensorFlow."""
    if export and is_ctranslate2(export):
        return (OSError,)
    from tfnmt.checkpoints import ModelDirError

    return ModelDirError, OSError, search_memory.SearchMemoryError


def _check_translation_export(version, loaded):
    """Raises DamagedFileError for a SavedModel whose serving_default signature is not
    export.py's (`sentences` string [B] in, `translations` and `scores` out): another tool's
    export ended in a traceback from the signature's arguments."""
    signature = loaded.signatures.get("serving_default")
    if signature is None:
        found = "has no serving_default signature"
    else:
        import tensorflow as tf

        inputs, outputs = signature.structured_input_signature[1], signature.structured_outputs
        spec = inputs.get("sentences")
        if spec is not None and spec.dtype == tf.string and \
                {"translations", "scores"} <= set(outputs):
            return
        found = "has a serving_default signature of " + ", ".join(
            f"{name} ({value.dtype.name})" for name, value in sorted(inputs.items())) + \
            " to " + ", ".join(sorted(outputs))
    raise DamagedFileError(f"{version} is not a translation export of export.py: it {found}, "
                           "where export.py's takes sentences (string) to translations and "
                           "scores")


def long_sources(signatures, sentences, first_line=1, most_named=10, unit="line",
                 output="translation"):
    """What to tell of the sentences longer than the model reads (their translations cover
    their first `max_length` - 1 subwords only).

    Args:
      signatures: `load_signatures`' functions.
      sentences: a list of str, the lines from `first_line` on (1 for the first).
      first_line: the line number of sentences[0].
      most_named: lines named at most; the rest are counted.
      unit: what the numbers count ("line" of a file; "sentence" of a split).
      output: what is made of a sentence ("translation"; "score" of a given translation).

    Returns:
      A message naming the lines and their subwords, or None when the model reads them all (or
      the export is too old to tell).
    """
    if "source_lengths" not in signatures or not sentences:
        return None
    subwords, max_subwords = signatures["source_lengths"](sentences)
    long = [(first_line + i, int(n)) for i, n in enumerate(subwords) if n > max_subwords]
    if not long:
        return None
    listed = text_lines.listed([f"{number} ({n:,} subwords)" for number, n in long], most_named)
    advice = " (split long lines into sentences)" if unit == "line" else ""
    if len(long) == 1:
        return (f"{unit} {listed} is longer than the {max_subwords:,} subwords the model reads: "
                f"its {output} covers the first {max_subwords:,}{advice}")
    return (f"{unit}s {listed} are longer than the {max_subwords:,} subwords the model reads: "
            f"each {output} covers its {unit}'s first {max_subwords:,}{advice}")


def other_language(model_dir, export, texts, name, side="source"):
    """A line saying that `texts`, given to the model as its `side`, read like the other side's
    language (`side_order.reads_like_other_side`, by the character pairs of the model's
    training text, which an export keeps in its assets.extra), or None (also where the model
    has no record of its training text and the text no longer reads).

    Args:
      model_dir, export: the model, as `load_signatures` takes them.
      texts: the sentences (a sample is enough: a few hundred).
      name: what the line calls them ("--input test.de").
      side: "source" (input to translate) or "target" (references).
    """
    from tfnmt.data import side_order

    if export:
        directory = export if is_ctranslate2(export) else os.path.join(latest_export(export),
                                                                       "assets.extra")
        try:
            profiles = side_order.read_profiles(os.path.join(directory, side_order.PROFILE_FILE))
        except FileNotFoundError:
            return None
    else:
        profiles = side_order.model_profiles(model_dir)
    fit = side_order.reads_like_other_side(profiles, texts, side)
    if not fit:
        return None
    other = "target" if side == "source" else "source"
    return (f"{name} reads like the model's {other} language, not its {side} language "
            f"(log-probability per character pair under its training {other}s "
            f"{fit[other]:.2f}, {side}s {fit[side]:.2f})")


def _from_strings(function, owner=None):
    """`function(**string tensors)` called with lists of str (holding `owner` alive)."""
    import tensorflow as tf

    def call(**inputs):
        return function(**{k: tf.constant(v, tf.string) for k, v in inputs.items()})
    call.owner = owner
    return call
