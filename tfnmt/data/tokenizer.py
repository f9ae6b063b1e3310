"""Subword vocabulary: SentencePiece learned on the training text, applied in-graph.

Training uses the `sentencepiece` package; tokenizing and detokenizing use tensorflow-text's
`SentencepieceTokenizer` over the same model proto, so training, evaluation and the exported
SavedModel tokenize identically. Byte fallback is on: a character outside the vocabulary becomes
its UTF-8 bytes instead of <unk>, so any valid text round-trips.

Text is normalized with SentencePiece's nmt_nfkc (Unicode NFKC), unless the training targets
are written with characters NFKC rewrites (`normalization_for`): Chinese text's fullwidth
punctuation ("，", "：", "？") would become ASCII, and the model could never write it. Such a
vocabulary only turns Unicode spaces into " " (`SPACES`) and keeps every other character.
"""
import contextlib
import hashlib
import io
import itertools
import os
import re
import unicodedata

import tensorflow as tf

from tfnmt.cpu_quota import usable_cores
from tfnmt.paths import write_atomically
from tfnmt.data.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID  # noqa: F401 (re-exported)


def train_sentencepiece(sentences, model_path, vocab_size=8000, model_type="unigram",
                        max_sentences=2_000_000, seed_sentencepiece_size=1_000_000,
                        normalization="nmt_nfkc"):
    """Learns a SentencePiece model and writes it without the paths of this machine
    (`portable_model_proto`), so copying a model_dir keeps its bytes.

    Args:
      sentences: an iterable of strings (source and target sentences for a shared vocabulary,
        one side's for separate ones).
      model_path: the model file to write (atomically: a `.tmp` name renamed when complete).
      vocab_size: pieces in the vocabulary, the four special tokens included.
      model_type: "unigram" or "bpe".
      max_sentences: sentences SentencePiece samples from the input.
      seed_sentencepiece_size: the unigram model's initial seed pieces.
      normalization: "nmt_nfkc" (SentencePiece's) or SPACES (`normalization_for`).

    Returns:
      `model_path`.

    Raises:
      ValueError: no text, or a vocabulary size the text cannot give.
    """
    import sentencepiece as spm

    if model_type not in ("unigram", "bpe"):
        raise ValueError(f"model_type must be 'unigram' or 'bpe', got {model_type!r}")
    os.makedirs(os.path.dirname(os.path.abspath(model_path)), exist_ok=True)
    prefix = model_path + ".tmp"
    count, failures = 0, []

    def checked(sentences):
        # An error raised while SentencePiece iterates reaches us wrapped in its RuntimeError
        # ("INTERNAL: ..."): keep the original to raise it as it was.
        nonlocal count
        try:
            for sentence in sentences:
                count += 1
                yield sentence
        except Exception as error:
            failures.append(error)
            raise

    try:
        try:
            # The model comes back in memory and is written here: SentencePiece's own write
            # left a truncated file on a full disk, unreadable, with no error.
            proto = _train(spm, checked(sentences), prefix, vocab_size, model_type,
                           max_sentences, seed_sentencepiece_size, normalization)
        except RuntimeError as error:
            raise _training_error(error, failures, count, vocab_size) from None
        write_atomically(model_path, portable_model_proto(proto))
    finally:  # a failure or Ctrl-C leaves no half-made files beside the model
        with contextlib.suppress(OSError):
            os.remove(prefix + ".rules.tsv")
    return model_path


def _training_error(error, failures, count, vocab_size):
    """What SentencePiece's RuntimeError `error` means: the error the input iterator raised
    (`failures`), no text (`count` 0), a vocabulary size the text cannot give, else itself."""
    if failures:
        return failures[0]
    if count == 0:
        return ValueError("no training text to learn the vocabulary from (the train split is "
                          "empty)")
    detail = str(error).split("] ")[-1]
    if "ocabulary size" in detail:  # too large or too small for this text
        return ValueError(f"vocabulary size {vocab_size:,d} does not fit the training text: "
                          f"{_vocabulary_size_advice(detail)}")
    return error


def _vocabulary_size_advice(detail):
    """SentencePiece's complaint about a vocabulary size, told in terms of --vocab_size (its
    own advice names its own options, which tfnmt's programs do not have)."""
    high = re.search(r"Vocabulary size too high \((\d+)\).*<= (\d+)", detail)
    if high:
        return f"it can give at most {int(high[2]):,d} pieces (--vocab_size)"
    low = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", detail)
    if low:
        return (f"it needs at least {int(low[2]):,d} pieces (one per character, 256 for "
                f"bytes, the special ones): give --vocab_size={int(low[2])} or more")
    return detail


# The rule of a vocabulary that keeps its targets' characters: Unicode's other spaces (no-break,
# en, em, thin, ideographic, ...) become " ", as NFKC makes them; nothing else changes.
# (SentencePiece's "identity" rule keeps characters too, but tensorflow-text logs a line to
# stderr each time it loads a model whose rule is empty.)
SPACES = "spaces"
_SPACE_CODES = (0x00A0, *range(0x2000, 0x200B), 0x202F, 0x205F, 0x3000)


def normalization_for(targets, sample=1000, share=0.1):
    """SentencePiece's normalization rule for a vocabulary that writes these targets.

    NFKC (SentencePiece's nmt_nfkc) unifies characters that look alike, which helps read
    inputs, but a model whose vocabulary is normalized can only write the normalized forms.
    Where many targets hold characters NFKC rewrites (Chinese text's fullwidth punctuation:
    "，" becomes ","), the references keep them and every translation would miss them.
    Unicode spaces (a no-break space before French punctuation) are not counted: both rules
    turn them into " ".

    Args:
      targets: target sentences; the first `sample` are read.
      share: the share of them NFKC must change for the rule to be SPACES.

    Returns:
      SPACES (characters kept as written, but for Unicode spaces) or "nmt_nfkc" (the default),
      and the share of targets NFKC changes.
    """
    spaces = dict.fromkeys(_SPACE_CODES, " ")
    count = changed = 0
    for sentence in itertools.islice(targets, sample):
        count += 1
        spaced = sentence.translate(spaces)  # both rules make these spaces: not counted
        changed += unicodedata.normalize("NFKC", spaced) != spaced
    fraction = changed / count if count else 0.0
    return (SPACES if fraction >= share else "nmt_nfkc"), fraction


def _train(spm, sentences, prefix, vocab_size, model_type, max_sentences,
           seed_sentencepiece_size, normalization):
    """SentencePiece's training; returns the serialized model (`prefix`: the normalization rule
    file's, where there is one)."""
    if normalization == SPACES:
        with open(prefix + ".rules.tsv", "w") as f:  # SentencePiece's format: hex code points
            f.writelines(f"{code:04X}\t0020\n" for code in _SPACE_CODES)
        rule = {"normalization_rule_tsv": prefix + ".rules.tsv"}
    else:
        rule = {"normalization_rule_name": normalization}
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=sentences, model_writer=model, vocab_size=vocab_size,
        model_type=model_type, pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
        byte_fallback=True, character_coverage=0.9999, **rule,
        input_sentence_size=max_sentences, shuffle_input_sentence=True,
        seed_sentencepiece_size=seed_sentencepiece_size, num_threads=usable_cores(),
        minloglevel=2)
    return model.getvalue()


def portable_model_proto(model_proto):
    """A SentencePiece model without the paths of the machine that trained it
    (`trainer_spec.model_prefix`, input files, a normalization rule file): it tokenizes
    identically, and its bytes no longer depend on the directory it was trained in.

    Args:
      model_proto: a serialized SentencePiece ModelProto.

    Returns:
      The serialized ModelProto without those paths.
    """
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(model_proto)
    model.trainer_spec.ClearField("model_prefix")
    model.trainer_spec.ClearField("input")
    model.normalizer_spec.ClearField("normalization_rule_tsv")
    model.denormalizer_spec.ClearField("normalization_rule_tsv")
    return model.SerializeToString(deterministic=True)


def fingerprint(model_proto):
    """A vocabulary's identity: sha256 of what makes a SentencePiece model tokenize as it does
    (pieces, scores, normalizer and trainer settings), not of where it was trained, so it
    survives `cp -r`/`mv` of the directory it was written in.

    Args:
      model_proto: a serialized SentencePiece ModelProto.

    Returns:
      The hex digest.
    """
    return hashlib.sha256(portable_model_proto(model_proto)).hexdigest()


def file_fingerprint(model_path):
    """`fingerprint` of a SentencePiece model file.

    Args:
      model_path: the file.

    Returns:
      The hex digest.
    """
    with open(model_path, "rb") as f:
        return fingerprint(f.read())


# Characters that carry no text: separators and blanks (\s, \p{Z}: NBSP, U+3000, U+2028, ...),
# control and format characters (\p{Cc}, \p{Cf}: zero-width space, BOM, soft hyphen, ...), and
# U+FFFD, which stands for bytes that were not UTF-8.
_NO_CONTENT = r"[\s\p{Z}\p{Cc}\p{Cf}\x{FFFD}]"


def has_content(strings):
    """Whether each string has a character that carries text (not blanks, control or format
    characters, or U+FFFD).

    Args:
      strings: [B] tf.string, valid UTF-8.

    Returns:
      [B] bool.
    """
    return tf.not_equal(tf.strings.regex_replace(strings, _NO_CONTENT, ""), "")


def to_source_ids(token_ids, max_length):
    """Model source ids from tokenized sentences.

    Args:
      token_ids: ragged subword ids [B, None].
      max_length: the longest source, EOS included (longer ones are cut).

    Returns:
      [B, S] int32: at most max_length - 1 subwords, then EOS, padded with PAD.
    """
    return padded_with_ends(token_ids[:, : max_length - 1], end_id=EOS_ID)


def padded_with_ends(token_ids, start_id=None, end_id=None):
    """Dense ids of ragged rows with a token before and/or after each row's ids.

    Built on the dense tensor: a ragged concat transposes its int64 row splits, which makes
    TensorFlow's oneDNN build log a spurious "oneDNN supports DT_INT64 only on platforms with
    AVX-512" error.

    Args:
      token_ids: ragged subword ids [B, None].
      start_id: the id put before each row's ids, or None.
      end_id: the id put after each row's ids, or None.

    Returns:
      [B, T] int32, PAD-padded; T the longest row plus the ends given.
    """
    ids = tf.cast(token_ids.to_tensor(PAD_ID), tf.int32)  # [B, S]
    lengths = tf.cast(token_ids.row_lengths(), tf.int32)  # [B]
    if start_id is not None:
        ids = tf.pad(ids, [[0, 0], [1, 0]], constant_values=start_id)
        lengths += 1
    if end_id is not None:
        ids = tf.pad(ids, [[0, 0], [0, 1]], constant_values=PAD_ID)
        at_end = tf.equal(tf.range(tf.shape(ids)[1])[None, :], lengths[:, None])  # [B, T]
        ids = tf.where(at_end, tf.constant(end_id, tf.int32), ids)
    return ids


def strip_output(ids):
    """The tokens of decoder outputs.

    Args:
      ids: [B, T] decoder output ids.

    Returns:
      Ragged [B, None] int32: cut at the first EOS, PAD removed.
    """
    ids = tf.convert_to_tensor(ids, tf.int32)
    before_eos = tf.equal(tf.cumsum(tf.cast(tf.equal(ids, EOS_ID), tf.int32), axis=1), 0)
    return tf.ragged.boolean_mask(ids, before_eos & tf.not_equal(ids, PAD_ID))


class Tokenizer:
    """Strings <-> SentencePiece ids with tensorflow-text (usable inside tf.function/SavedModel).

    Note: `tf.random.set_seed` (and so `keras.utils.set_random_seed`) clears TensorFlow's
    eager kernel cache, which deletes the SentencePiece resource of every tokenizer made
    before it. Seed first, then make tokenizers.

    Args:
      model_path: a SentencePiece model file.

    Example:
      tokenizer = Tokenizer("runs/de-en/spm.model")
      ids = tokenizer.tokenize(["Guten Morgen."])     # RaggedTensor [1, None] int32
      tokenizer.detokenize(ids)                       # [b"Guten Morgen."]
    """

    def __init__(self, model_path):
        import tensorflow_text as tf_text

        with open(model_path, "rb") as f:
            self.model_proto = f.read()
        self.model_path = model_path
        self.fingerprint = fingerprint(self.model_proto)
        self._sp = tf_text.SentencepieceTokenizer(model=self.model_proto, out_type=tf.int32)
        self.vocab_size = int(self._sp.vocab_size())

    def tokenize(self, strings):
        """Tokenizes strings. Invalid UTF-8 bytes are replaced by U+FFFD first, so malformed input
        gives a defined result, not an error.

        Args:
          strings: [B] tf.string.

        Returns:
          RaggedTensor [B, None] int32 of ids (no BOS/EOS).
        """
        strings = tf.strings.unicode_transcode(strings, "UTF-8", "UTF-8", errors="replace")
        return self._sp.tokenize(strings)

    def detokenize(self, ids):
        """Joins ids into text; stops at the first EOS.

        Args:
          ids: [B, T] ids (dense and PAD-padded, or ragged).

        Returns:
          [B] tf.string.
        """
        if not isinstance(ids, tf.RaggedTensor):
            ids = strip_output(ids)
        return self._sp.detokenize(ids)

    def id_to_piece(self, ids):
        """The pieces of ids.

        Args:
          ids: int32 ids, any shape.

        Returns:
          tf.string pieces, same shape.
        """
        return self._sp.id_to_string(ids)
