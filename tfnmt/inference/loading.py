"""Translators loaded for use in Python: from a model_dir's checkpoint (a `TranslationModule`
built on the spot) or from an export (its signatures), behind the same functions."""
import os

import tensorflow as tf

from tfnmt.inference.saved_model import next_version
from tfnmt.inference.serving import TranslationModule
from tfnmt.paths import DamagedFileError, other_kind


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
        hint = other_kind(path)
        raise FileNotFoundError(f"{path} holds no SavedModel and no numbered version of one"
                                + (f"; {hint}" if hint else ""))
    return os.path.join(path, str(version))


def load_translate_fn(model_dir=None, export=None, beam_size=4, alpha=None, checkpoint="auto",
                      beam_stop="finished"):
    """A translation function from a model_dir's checkpoint or from an export.

    Args:
      model_dir: a training directory (used when `export` is not given).
      export: an export version directory, or an export_dir (its newest version).
      beam_size, alpha, beam_stop: beam settings for a model_dir (an export keeps its own);
        alpha None: the model_dir's (`length_penalty.default_alpha`).
      checkpoint: which checkpoint of the model_dir (`checkpoints.load_model`'s `which`).

    Returns:
      A function string [B] -> (translations string [B], scores float32 [B]).
    """
    return load_signatures(model_dir, export, beam_size, alpha, checkpoint,
                           beam_stop=beam_stop)["serving_default"]


def load_signatures(model_dir=None, export=None, beam_size=4, alpha=None, checkpoint="auto",
                    n_best=1, sampling=None, beam_stop="finished"):
    """The translator's signatures as Python functions, from a model_dir's checkpoint or from
    an export (the signatures it has).

    Args:
      model_dir: a training directory (used when `export` is not given).
      export: an export version directory, or an export_dir (its newest version).
      beam_size, alpha, n_best, beam_stop: beam settings for a model_dir (an export keeps its
        own); alpha None: the model_dir's (`length_penalty.default_alpha`).
      checkpoint: which checkpoint of the model_dir (`checkpoints.load_model`'s `which`).
      sampling: for a model_dir, draw translations at random (`TranslationModule`'s).

    Returns:
      {"serving_default": sentences -> (translations [B], scores [B]),
       "translate_n_best": sentences -> (translations [B, N], scores [B, N]),
       "translate_with_prefix": (sentences, prefixes) -> (translations [B], scores [B]),
       "score": (sentences, targets) -> (log-probabilities [B], lengths [B])}, each taking
      lists of str and returning tensors.

    Raises:
      FileNotFoundError: `export` holds no SavedModel.
      DamagedFileError: the export's files do not load (cut short, or missing).
      checkpoints.ModelDirError: the model_dir has no model that reads back.
    """
    if export:
        import tensorflow_text  # noqa: F401  registers the SentencePiece ops

        version = latest_export(export)
        try:
            signatures = tf.saved_model.load(version).signatures
        except (tf.errors.OpError, OSError, IndexError, ValueError) as error:
            # A cut or missing file: TensorFlow's message, without its advice on devices.
            raise DamagedFileError(f"{version} does not load as a SavedModel: "
                                   f"{str(error).strip().splitlines()[0]}") from None
        run = {name: _from_strings(signatures[name]) for name in signatures}
    else:
        from tfnmt.checkpoints import load_model
        from tfnmt.inference.length_penalty import default_alpha

        model, vocab, _ = load_model(model_dir, checkpoint)
        alpha = default_alpha(model_dir)[0] if alpha is None else alpha
        module = TranslationModule(model, vocab, beam_size, alpha, n_best=n_best,
                                   sampling=sampling, beam_stop=beam_stop)
        # A tf.function method holds its instance weakly: the functions keep `module` alive.
        run = {"serving_default": _from_strings(module.serve, module),
               "translate_n_best": _from_strings(module.serve_n_best, module),
               "translate_with_prefix": _from_strings(module.serve_with_prefix, module),
               "score": _from_strings(module.score, module)}

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

    functions = {name: translate(name) for name in ("serving_default", "translate_n_best")
                 if name in run}
    for name, function in (("translate_with_prefix", with_prefix), ("score", score)):
        if name in run:  # exports made before these signatures existed lack them
            functions[name] = function
    return functions


def _from_strings(function, owner=None):
    """`function(**string tensors)` called with lists of str (holding `owner` alive)."""
    def call(**inputs):
        return function(**{k: tf.constant(v, tf.string) for k, v in inputs.items()})
    call.owner = owner
    return call
