"""A CTranslate2 model (export.py --format=ctranslate2) behind the functions
`loading.load_signatures` gives for a checkpoint or a SavedModel, so that translate.py and
evaluate.py run it with `--export=<model_dir>/ctranslate2`. Neither TensorFlow nor
tensorflow-text is imported: CTranslate2 searches, SentencePiece tokenizes.

Each sentence is cut to the model's max_length - 1 subwords (then EOS), as the SavedModel cuts
it, and the search stops at max_length subwords. A sentence without a character that carries
text (blank, or only control and format characters or U+FFFD) is answered with "" and score 0,
as the SavedModel answers it. The search is CTranslate2's own: its length penalty divides a
hypothesis' log-probability by length**alpha (tfnmt's by ((5 + length) / 6)**alpha), and its
scores are those normalised log-probabilities; `score` gives the unnormalised log-probability
of a given translation, as the SavedModel's `score` does.
"""
import json
import math
import os
import unicodedata

import numpy as np

from tfnmt.data import vocabulary
from tfnmt.inference.length_penalty import is_ngram_count
from tfnmt.paths import CTRANSLATE2_SETTINGS

DEFAULT_ALPHA = 1.0  # CTranslate2's default length_penalty
# The dev BLEU a length_penalty must gain over its neighbour to be chosen instead: on a main job's
# 462 dev pairs, neighbouring penalties 0.3 apart differed by 0.03-0.06 where test BLEU did not
# follow (docs/serving.md).
MIN_BLEU_GAIN = 0.1
# Dev pairs the choice translates at most (evenly spaced through a larger split): each penalty
# tried is one pass over them, and a WMT dev split of 3,000 pairs would keep a CPU export of
# `base` busy for many minutes.
CHOICE_PAIRS = 1000
# Unicode categories of characters that carry no text (tfnmt.data.tokenizer.has_content).
_NO_TEXT = {"Zs", "Zl", "Zp", "Cc", "Cf"}
# Format controls since Unicode 15.0 (Egyptian hieroglyphs), which Python 3.11's tables (Unicode
# 14) leave unassigned; the SavedModel's rule (RE2's classes) knows them.
_FORMAT_SINCE_UNICODE_15 = frozenset(map(chr, range(0x13439, 0x13440)))


class CTranslate2ModelError(ValueError):
    """A CTranslate2 directory that translate.py cannot run: its tfnmt.json missing, or the
    ctranslate2 package."""


def check_runnable(directory):
    """Raises CTranslate2ModelError where `directory` cannot be run here (`model_settings`; the
    ctranslate2 or sentencepiece package not installed)."""
    import importlib.util

    model_settings(directory)
    for package in ("ctranslate2", "sentencepiece"):
        if importlib.util.find_spec(package) is None:
            raise CTranslate2ModelError(f"{directory} is a CTranslate2 model, and the {package} "
                                        f"package is not installed (pip install {package})")


def model_settings(directory):
    """The settings export.py wrote beside the CTranslate2 model ({"max_length": int;
    "no_repeat_ngram_size": int where the model_dir had one; "length_penalty": float where
    export.py chose one on dev or was given one, with "length_penalty_chosen_on" and, chosen
    on dev, "dev_bleu": {penalty: sacreBLEU}}).

    Raises:
      CTranslate2ModelError: the directory lacks them (converted by other means).
    """
    try:
        with open(os.path.join(directory, CTRANSLATE2_SETTINGS)) as f:
            settings = json.load(f)
        int(settings["max_length"])
        if not is_ngram_count(settings.get("no_repeat_ngram_size", 0)):
            raise ValueError("no_repeat_ngram_size is not a count")
        penalty = settings.get("length_penalty", DEFAULT_ALPHA)
        if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or \
                not 0 <= penalty < math.inf:
            raise ValueError("length_penalty is not a finite number >= 0")
    except (OSError, ValueError, KeyError, TypeError):
        raise CTranslate2ModelError(
            f"{directory} is a CTranslate2 model without a readable {CTRANSLATE2_SETTINGS} (the "
            "model's max_length, which export.py --format=ctranslate2 writes): remove it and "
            "export the model again") from None
    return settings


def has_content(text):
    """Whether `text` has a character that carries text (not a blank, control or format
    character, or U+FFFD)."""
    return any(not (c.isspace() or c == "\ufffd" or unicodedata.category(c) in _NO_TEXT
                    or c in _FORMAT_SINCE_UNICODE_15) for c in text)


def _processors(directory, sentencepiece):
    """(source, target) SentencePieceProcessors of the model's spm.model (or source.spm.model
    and target.spm.model), or OSError naming what is missing or does not load."""
    shared, separate = vocabulary.file_names(False), vocabulary.file_names(True)
    names = shared if os.path.exists(os.path.join(directory, shared["source"])) else separate
    processors = []
    for side in ("source", "target"):
        path = os.path.join(directory, names[side])
        if not os.path.exists(path):
            raise OSError(f"{directory} holds no {shared['source']} (nor {separate['source']} "
                          f"and {separate['target']}): the SentencePiece model export.py puts "
                          "beside CTranslate2's files; remove it and export the model again")
        try:
            processors.append(sentencepiece.SentencePieceProcessor(model_file=path))
        except (RuntimeError, OSError) as error:
            raise OSError(f"{path} does not load as a SentencePiece model: "
                          f"{str(error).strip().splitlines()[0]}") from None
    return tuple(processors)


def load_signatures(directory, beam_size=4, alpha=None, n_best=1, sampling=None,
                    no_repeat_ngram_size=None, threads=None):
    """`loading.load_signatures`' functions, run by CTranslate2.

    Args:
      directory: a directory export.py --format=ctranslate2 wrote.
      beam_size, n_best, no_repeat_ngram_size: CTranslate2's beam_size, num_hypotheses and
        no_repeat_ngram_size (None: the one export.py kept in tfnmt.json, else 0).
      alpha: CTranslate2's length_penalty (None: the one export.py kept in tfnmt.json, else
        DEFAULT_ALPHA).
      sampling: None, or {"top_k", "temperature", "seed"}: draw each translation at random
        (CTranslate2's sampling_topk, 0 for all words, and sampling_temperature).
      threads: CPU threads of the search (None: the cores this process may use).

    Returns:
      {"serving_default", "translate_n_best", "translate_with_prefix", "score",
      "source_lengths"}, as `loading.load_signatures` gives them, with numpy arrays (UTF-8
      bytes for text) in place of tensors.

    Raises:
      CTranslate2ModelError: no tfnmt.json beside the model.
      OSError: the model does not load, or ctranslate2 does not import.
    """
    try:
        import ctranslate2
        import sentencepiece
    except ImportError as error:
        raise OSError(f"{directory} is a CTranslate2 model, and {error.name or 'ctranslate2'} "
                      f"does not import here ({error})") from None

    from tfnmt.cpu_quota import usable_cores

    settings = model_settings(directory)
    max_length = int(settings["max_length"])
    if no_repeat_ngram_size is None:
        no_repeat_ngram_size = settings.get("no_repeat_ngram_size", 0)
    source_sp, target_sp = _processors(directory, sentencepiece)
    gpu = ctranslate2.get_cuda_device_count() > 0
    try:
        translator = ctranslate2.Translator(
            directory, device="cuda" if gpu else "cpu", inter_threads=1,
            intra_threads=0 if gpu else threads or usable_cores())
    except (RuntimeError, ValueError) as error:
        raise OSError(f"{directory} does not load as a CTranslate2 model: {error}") from None
    if sampling is not None:
        ctranslate2.set_random_seed(sampling["seed"] % 2**32)
        search = dict(beam_size=1, sampling_topk=sampling["top_k"],
                      sampling_temperature=sampling["temperature"])
    else:
        if alpha is None:
            alpha = float(settings.get("length_penalty", DEFAULT_ALPHA))
        search = dict(beam_size=beam_size, length_penalty=alpha,
                      no_repeat_ngram_size=no_repeat_ngram_size)
    # An end at the first step allowed, as tfnmt's searches allow it (CTranslate2's default: 1).
    limits = dict(max_input_length=max_length, max_decoding_length=max_length,
                  min_decoding_length=0)

    def pieces(processor, texts):
        return [processor.encode(text, out_type=str)[:max_length - 1] for text in texts]

    def translate(sentences, columns, prefixes=None):
        """-> (translations bytes [B, columns], scores float32 [B, columns])."""
        translations = np.full([len(sentences), columns], b"", object)
        scores = np.zeros([len(sentences), columns], np.float32)
        rows = [i for i, text in enumerate(sentences) if has_content(text)]
        if rows:
            prefix = None if prefixes is None else [
                pieces(target_sp, [prefixes[i]])[0] or None for i in rows]
            results = translator.translate_batch(
                pieces(source_sp, [sentences[i] for i in rows]), target_prefix=prefix,
                num_hypotheses=columns, return_scores=True, **search, **limits)
            for i, result in zip(rows, results):
                for column, (hypothesis, score) in enumerate(
                        zip(result.hypotheses, result.scores)):
                    translations[i, column] = target_sp.decode(hypothesis).encode("utf-8")
                    scores[i, column] = score
        return translations, scores

    def serving_default(sentences):
        translations, scores = translate(sentences, 1)
        return translations[:, 0], scores[:, 0]

    def with_prefix(sentences, prefixes):
        translations, scores = translate(sentences, 1, prefixes)
        return translations[:, 0], scores[:, 0]

    def score(sentences, targets):
        results = translator.score_batch(pieces(source_sp, sentences),
                                         pieces(target_sp, targets),
                                         max_input_length=max_length)
        return (np.array([sum(result.log_probs) for result in results], np.float32),
                np.array([len(result.log_probs) for result in results], np.int32))

    def source_lengths(sentences):
        return (np.array([len(source_sp.encode(text)) for text in sentences], np.int32),
                max_length - 1)

    return {"serving_default": serving_default,
            "translate_n_best": lambda sentences: translate(sentences, n_best),
            "translate_with_prefix": with_prefix, "score": score,
            "source_lengths": source_lengths}


def choice_pairs(pairs, limit=CHOICE_PAIRS):
    """At most `limit` of the (source, reference) `pairs`, evenly spaced: every k-th for the
    smallest k that leaves no more (all of them where there are no more)."""
    stride = max(1, math.ceil(len(pairs) / limit))
    return pairs[::stride]


def choose_length_penalty(directory, sources, references, tokenize="13a", batch_size=32):
    """The length_penalty under which the model's beam-4 translations of `sources` score the
    highest sacreBLEU against `references`, with the rule tfnmt.json keeps: climbing from
    CTranslate2's default, DEFAULT_ALPHA, in steps of 0.3 between 0.1 and 2.5, each step for a
    gain of more than MIN_BLEU_GAIN (`length_penalty.climb_alpha`).

    GNMT's alpha that train.py chose for the model (decoding.json) does not carry over: the
    penalties differ in form, ((5 + length) / 6)**alpha against length**alpha.

    Args:
      directory: a CTranslate2 model directory with its tfnmt.json.
      sources, references: the dev split's sentence pairs, as two lists of str.
      tokenize: sacreBLEU's tokenization of the target language (`bleu_tokenization`).
      batch_size: sentences per call.

    Returns:
      (the length_penalty, {length_penalty: sacreBLEU} of those tried).
    """
    from tfnmt.inference.batching import translate_lines
    from tfnmt.inference.length_penalty import climb_alpha
    from tfnmt.inference.sacrebleu_scores import corpus_scores

    def bleu(alpha):
        signatures = load_signatures(directory, alpha=alpha)
        translations = translate_lines(signatures["serving_default"], sources, batch_size)
        return corpus_scores(translations, references, tokenize=tokenize)["bleu"]

    return climb_alpha(bleu, start=DEFAULT_ALPHA, min_gain=MIN_BLEU_GAIN)
