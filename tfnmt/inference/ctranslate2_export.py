"""A trained Transformer as a CTranslate2 model (https://opennmt.net/CTranslate2).

CTranslate2 is a C++ inference engine for Transformer translation models on CPUs and GPUs, with
int8/int16/float16 weights. `export_ctranslate2` fills CTranslate2's own `TransformerSpec` with
the model's weights through its Python converter API and writes the converted model with the
SentencePiece model beside it:

  <output_dir>/model.bin, config.json, shared_vocabulary.json   (CTranslate2's files)
  <output_dir>/spm.model                                         (tokenize and detokenize)
  <output_dir>/tfnmt.json        (the model's max_length; for translate.py and evaluate.py
                                  the no-repeat rule of the model_dir where it has one, and
                                  the length_penalty chosen on its dev split or given)

(with separate vocabularies: source_vocabulary.json and target_vocabulary.json, and
source.spm.model to tokenize, target.spm.model to detokenize).

translate.py and evaluate.py run it as --export (`ctranslate2_translator`). Translating with it
in Python (pieces in, pieces out; the source's end-of-sentence is added by the model's
config, as tfnmt adds it):

  import ctranslate2, sentencepiece
  sp = sentencepiece.SentencePieceProcessor(model_file="runs/de-en/ctranslate2/spm.model")
  translator = ctranslate2.Translator("runs/de-en/ctranslate2", compute_type="int8")
  results = translator.translate_batch([sp.encode(s, out_type=str) for s in sentences],
                                       beam_size=4, length_penalty=0.6,
                                       max_input_length=256, max_decoding_length=256)
  translations = [sp.decode(r.hypotheses[0]) for r in results]

256 is the model's max_length (`--max_length`, 256 by default): its positions. CTranslate2's
default limits (1,024 input tokens) end in an error on a longer source ("No position encodings
are defined for positions >= 256"); max_input_length=max_length keeps max_length - 1 pieces and
the end-of-sentence, as the SavedModel truncates.

CTranslate2 computes the model's log-probabilities (tests/test_ctranslate2_export.py) and its
greedy translations. Its beam search differs in two ways: it normalises scores by
length**length_penalty where tfnmt uses the GNMT penalty ((5 + length) / 6)**alpha, and it keeps
the best k extensions per step where tfnmt keeps 2k (so tfnmt can keep a finished hypothesis
that CTranslate2 drops); beam outputs agree where neither matters.
"""
import errno
import json
import os
import shutil
import tempfile

import numpy as np

from tfnmt.layers.embedding import sinusoid_table
from tfnmt.data.vocabulary import as_protos, write_protos
from tfnmt.paths import CTRANSLATE2_SETTINGS, made_directory

QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16",
                 "bfloat16", "float32")
CHECK_SENTENCES = ("Guten Morgen.", "Das ist ein Test.")


class CTranslate2ExportError(RuntimeError):
    """The model cannot be converted, or the converted model does not load and translate."""


def _numpy(variable):
    return np.asarray(variable.numpy(), dtype=np.float32)


def _set_linear(spec, kernel, bias=None):
    spec.weight = _numpy(kernel).T  # Keras [in, out] -> CTranslate2 [out, in]
    if bias is not None:
        spec.bias = _numpy(bias)


def _set_layer_norm(spec, norm):
    spec.gamma, spec.beta = _numpy(norm.gamma), _numpy(norm.beta)


def _set_attention(spec, attention, norm, self_attention):
    a = attention
    query = (_numpy(a.query_kernel).T, _numpy(a.query_bias))
    key = (_numpy(a.key_kernel).T, _numpy(a.key_bias))
    value = (_numpy(a.value_kernel).T, _numpy(a.value_bias))
    # CTranslate2 fuses Q, K and V of self-attention into one matrix, K and V of cross-attention.
    groups = [[query, key, value]] if self_attention else [[query], [key, value]]
    for linear, group in zip(spec.linear, groups):
        linear.weight = np.concatenate([w for w, _ in group], axis=0)
        linear.bias = np.concatenate([b for _, b in group], axis=0)
    _set_linear(spec.linear[-1], a.output_kernel, a.output_bias)
    _set_layer_norm(spec.layer_norm, norm)


def _set_feed_forward(spec, feed_forward, norm):
    _set_linear(spec.linear_0, feed_forward.inner_kernel, feed_forward.inner_bias)
    _set_linear(spec.linear_1, feed_forward.output_kernel, feed_forward.output_bias)
    _set_layer_norm(spec.layer_norm, norm)


def _position_table(model):
    """[max_length, D]: tfnmt's own encodings (its sinusoids interleave sin and cos, CTranslate2's
    built-in ones do not), so the converted model adds exactly what the model adds."""
    positions = model.positions
    if positions.kind == "learned":
        return _numpy(positions.position_embeddings)
    return np.asarray(sinusoid_table(np.arange(model.max_length), model.d_model), np.float32)


def transformer_spec(model, source_pieces, target_pieces):
    """Returns a CTranslate2 TransformerSpec holding `model`'s weights (float32).

    Args:
      model: a built tfnmt `Transformer`.
      source_pieces, target_pieces: each side's SentencePiece vocabulary, piece strings in id
        order (the same list twice for a shared vocabulary).
    Raises:
      CTranslate2ExportError: the model has a setting CTranslate2's Transformer cannot express.
    """
    from ctranslate2.specs import common_spec, transformer_spec as ct2

    settings = model.settings
    activations = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}
    if settings["activation"] not in activations:
        raise CTranslate2ExportError(f"activation {settings['activation']!r} has no CTranslate2 "
                                     "equivalent")
    for side, pieces in (("source", source_pieces), ("target", target_pieces)):
        if settings[f"{side}_vocab_size"] != len(pieces):
            raise CTranslate2ExportError(
                f"{side} vocabulary of {settings[f'{side}_vocab_size']} ids, but the "
                f"SentencePiece model has {len(pieces)} pieces")
    common = dict(num_heads=settings["num_heads"], pre_norm=settings["norm_first"],
                  activation=activations[settings["activation"]])
    spec = ct2.TransformerSpec(
        ct2.TransformerEncoderSpec(settings["num_encoder_layers"], **common),
        ct2.TransformerDecoderSpec(settings["num_decoder_layers"], **common))
    spec.config.layer_norm_epsilon = settings["layer_norm_epsilon"]
    spec.config.add_source_eos = True  # tfnmt ends every source with EOS, starts no BOS
    spec.config.add_source_bos = False
    spec.register_source_vocabulary(list(source_pieces))  # equal lists: one shared file
    spec.register_target_vocabulary(list(target_pieces))

    encoder, decoder = spec.encoder, spec.decoder
    positions = _position_table(model)
    encoder.embeddings[0].weight = _numpy(model.source_embedding.embeddings)
    decoder.embeddings.weight = _numpy(model.target_embedding.embeddings)
    encoder.position_encodings.encodings = positions
    decoder.position_encodings.encodings = positions
    for layer_spec, layer in zip(encoder.layer, model.encoder_layers):
        _set_attention(layer_spec.self_attention, layer.self_attention,
                       layer.self_attention_norm, self_attention=True)
        _set_feed_forward(layer_spec.ffn, layer.feed_forward, layer.feed_forward_norm)
    for layer_spec, layer in zip(decoder.layer, model.decoder_layers):
        _set_attention(layer_spec.self_attention, layer.self_attention,
                       layer.self_attention_norm, self_attention=True)
        _set_attention(layer_spec.attention, layer.cross_attention, layer.cross_attention_norm,
                       self_attention=False)
        _set_feed_forward(layer_spec.ffn, layer.feed_forward, layer.feed_forward_norm)
    if model.encoder_norm is not None:
        _set_layer_norm(encoder.layer_norm, model.encoder_norm)
        _set_layer_norm(decoder.layer_norm, model.decoder_norm)
    decoder.projection.weight = _numpy(model.output_kernel())  # [V, D], no bias
    return spec


def _processor(spm_model_proto):
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_proto=spm_model_proto)


def spm_pieces(spm_model_proto):
    """A SentencePiece model's vocabulary, for CTranslate2.

    Args:
      spm_model_proto: a serialized SentencePiece ModelProto.

    Returns:
      The pieces, in id order.
    """
    processor = _processor(spm_model_proto)
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def export_ctranslate2(model, vocabulary, output_dir, quantization=None, check=True,
                       extra_files=(), no_repeat_ngram_size=0, length_penalty=None,
                       dev_pairs=None):
    """Converts `model` into a new directory `output_dir` (its SentencePiece model(s) beside
    CTranslate2's files).

    The model is written to a temporary directory next to `output_dir`, loaded by CTranslate2
    and asked to translate two sentences (`check`), and only then renamed into place: a failed
    export leaves nothing at `output_dir`.

    Args:
      model: a built tfnmt `Transformer`.
      vocabulary: the SentencePiece model the model was trained with (bytes), or a
        `vocabulary.VocabularyProtos` (`checkpoints.load_model` gives one).
      output_dir: a directory that must not exist yet.
      quantization: None (float32 weights) or one of QUANTIZATIONS.
      check: load and translate before publishing.
      extra_files: paths of files copied into it (the training text's character pairs).
      no_repeat_ngram_size: N > 0: translate.py's and evaluate.py's default
        no_repeat_ngram_size for the model (kept in tfnmt.json).
      length_penalty: their default length_penalty for the model (kept in tfnmt.json), or
        None: chosen on `dev_pairs` where given (with `check`), else CTranslate2's default.
      dev_pairs: (sources, references, sacreBLEU tokenization) to choose the length_penalty
        on (`ctranslate2_translator.choose_length_penalty`), with the model as written
        (quantized where it is).
    Returns:
      output_dir.
    Raises:
      FileExistsError: output_dir exists (also when another export wrote it meanwhile).
      CTranslate2ExportError: the model cannot be converted, or the check (or the choice
        on `dev_pairs`) failed.
    """
    import ctranslate2.converters

    if quantization not in (None,) + QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    output_dir = os.path.abspath(output_dir)
    if os.path.exists(output_dir):
        raise FileExistsError(f"{output_dir} exists; give another --export_dir or remove it")
    protos = as_protos(vocabulary)
    spec = transformer_spec(model, spm_pieces(protos.source), spm_pieces(protos.target))

    class _Converter(ctranslate2.converters.Converter):
        def _load(self):
            return spec

    parent = os.path.dirname(output_dir)
    with made_directory(parent):
        staging = tempfile.mkdtemp(prefix=".ctranslate2-", dir=parent)
        try:
            model_dir = os.path.join(staging, "model")
            _Converter().convert(model_dir, quantization=quantization)
            write_protos(model_dir, protos)
            settings = {"max_length": model.max_length}
            if no_repeat_ngram_size:
                settings["no_repeat_ngram_size"] = int(no_repeat_ngram_size)
            if length_penalty is not None:
                settings.update(length_penalty=float(length_penalty),
                                length_penalty_chosen_on="--alpha")
            _write_settings(model_dir, settings)
            for path in extra_files:
                shutil.copy(path, model_dir)
            if check:
                _check(model_dir, protos.source)
                if length_penalty is None and dev_pairs is not None:
                    from tfnmt.inference.ctranslate2_translator import choose_length_penalty

                    sources, references, tokenize = dev_pairs
                    try:
                        best, scores = choose_length_penalty(model_dir, sources, references,
                                                             tokenize)
                    except RuntimeError as error:  # CTranslate2's, e.g. out of memory
                        raise CTranslate2ExportError(
                            f"CTranslate2 failed translating the dev split: {error}") from None
                    settings.update(length_penalty=best, length_penalty_chosen_on="dev",
                                    dev_bleu={f"{a:g}": round(b, 2) for a, b in scores.items()})
                    _write_settings(model_dir, settings)
            try:  # a rename never replaces a directory with files in it
                os.rename(model_dir, output_dir)
            except OSError as error:
                if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                raise FileExistsError(f"{output_dir} was written by another export while this "
                                      "one was; give another --export_dir or remove it") from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return output_dir


def _write_settings(model_dir, settings):
    with open(os.path.join(model_dir, CTRANSLATE2_SETTINGS), "w") as f:
        json.dump(settings, f)


def _check(model_dir, source_proto):
    import ctranslate2

    processor = _processor(source_proto)
    try:
        translator = ctranslate2.Translator(model_dir, device="cpu")
        results = translator.translate_batch(
            [processor.encode(s, out_type=str) for s in CHECK_SENTENCES], beam_size=2,
            max_decoding_length=8)
    except (RuntimeError, ValueError) as error:
        raise CTranslate2ExportError(f"CTranslate2 cannot run the converted model: {error}")
    if len(results) != len(CHECK_SENTENCES):
        raise CTranslate2ExportError("CTranslate2 returned no translation for the check sentences")
