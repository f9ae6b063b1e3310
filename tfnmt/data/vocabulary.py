"""A model's vocabulary: one SentencePiece model for source and target (the paper's shared
vocabulary, the default), or one per side (`train.py --separate_vocabularies`: languages with
different scripts, or a target vocabulary sized apart).

A model_dir, a prepared-data directory and a CTranslate2 export hold the files

  spm.model                              shared
  source.spm.model, target.spm.model     separate

Its fingerprint is the SentencePiece model's (`tokenizer.fingerprint`) when shared, so model_dirs
written before separate vocabularies existed keep theirs; separate ones combine both sides'.
"""
import hashlib
import os
from typing import NamedTuple

from tfnmt.paths import VOCAB, DamagedFileError, write_atomically

# tfnmt.data.tokenizer loads TensorFlow: imported where used, so that train.py checks a
# --vocab before TensorFlow loads.

SIDE_FILES = {"source": "source.spm.model", "target": "target.spm.model"}


def file_names(separate):
    """{"source": name, "target": name} of the SentencePiece files (one name twice if shared)."""
    return dict(SIDE_FILES) if separate else {"source": VOCAB, "target": VOCAB}


def paths(directory, separate):
    """(source path, target path) of a directory's vocabulary files."""
    names = file_names(separate)
    return os.path.join(directory, names["source"]), os.path.join(directory, names["target"])


def combined_fingerprint(source_fingerprint, target_fingerprint):
    """A vocabulary's fingerprint from its sides': the one fingerprint when they are the same
    model, else a digest of both."""
    if source_fingerprint == target_fingerprint:
        return source_fingerprint
    return hashlib.sha256(f"{source_fingerprint}:{target_fingerprint}".encode()).hexdigest()


class VocabularyProtos(NamedTuple):
    """The serialized SentencePiece models of a vocabulary (the same model twice if shared)."""

    source: bytes
    target: bytes

    @property
    def shared(self):
        """Whether both sides are one model (by `tokenizer.fingerprint`, as `Vocabulary`)."""
        from tfnmt.data.tokenizer import fingerprint

        return self.source == self.target or fingerprint(self.source) == fingerprint(self.target)

    @property
    def fingerprint(self):
        from tfnmt.data.tokenizer import fingerprint

        return combined_fingerprint(fingerprint(self.source), fingerprint(self.target))


def as_protos(vocabulary):
    """`VocabularyProtos` of a shared model's bytes or of a (source, target) pair of bytes."""
    if isinstance(vocabulary, (bytes, bytearray)):
        return VocabularyProtos(bytes(vocabulary), bytes(vocabulary))
    source, target = vocabulary
    return VocabularyProtos(bytes(source), bytes(target))


def read_protos(source_path, target_path):
    """`VocabularyProtos` of SentencePiece model files (the same path twice when shared).

    Raises:
      OSError: a file is missing or unreadable.
      DamagedFileError: a file is not a SentencePiece model.
    """
    source = _read_model(source_path)
    if target_path == source_path:
        return VocabularyProtos(source, source)
    return VocabularyProtos(source, _read_model(target_path))


def _read_model(path):
    """A SentencePiece model file's bytes, refused here (one line) where they do not parse:
    tf-text and sentencepiece would fail later, with a traceback of their own."""
    from google.protobuf.message import DecodeError
    from sentencepiece import sentencepiece_model_pb2

    with open(path, "rb") as f:
        data = f.read()
    model = sentencepiece_model_pb2.ModelProto()
    try:
        model.ParseFromString(data)
    except DecodeError as error:
        raise DamagedFileError(f"{path} is not a SentencePiece model ({error}): restore it, or "
                               "use another --model_dir") from None
    if not model.pieces:
        raise DamagedFileError(f"{path} is not a SentencePiece model (it holds no pieces): "
                               "restore it, or use another --model_dir")
    return data


def check_given_model(path):
    """A SentencePiece model a user gives to tokenize with (train.py --vocab), refused in one
    line (ValueError) where it cannot be: not a file, not a SentencePiece model, or reserving
    other ids than tfnmt's PAD, UNK, BOS and EOS (`special_tokens`), which every model reads
    as such.

    Args:
      path: the model file.
    """
    from sentencepiece import sentencepiece_model_pb2

    from tfnmt.data.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

    if not os.path.isfile(path):
        raise ValueError(f"{path}: " + ("is a directory, not a file" if os.path.isdir(path)
                                        else "file not found"))
    try:
        model = sentencepiece_model_pb2.ModelProto.FromString(_read_model(path))
    except DamagedFileError:
        raise ValueError(f"{path} is not a SentencePiece model") from None
    wanted = {"pad_id": PAD_ID, "unk_id": UNK_ID, "bos_id": BOS_ID, "eos_id": EOS_ID}
    ids = {name: getattr(model.trainer_spec, name) for name in wanted}
    if ids != wanted:
        given = ", ".join(f"{name} {value}" for name, value in ids.items())
        flags = " ".join(f"--{name}={value}" for name, value in wanted.items())
        raise ValueError(f"{path} reserves other ids ({given}) than tfnmt's: train it with "
                         f"{flags}")


def piece_count(path):
    """The number of pieces of a SentencePiece model file (its vocabulary size)."""
    from sentencepiece import sentencepiece_model_pb2

    return len(sentencepiece_model_pb2.ModelProto.FromString(_read_model(path)).pieces)


def model_type(model_proto):
    """A serialized SentencePiece model's type: "unigram", "bpe", "word" or "char"."""
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto.FromString(model_proto)
    return sentencepiece_model_pb2.TrainerSpec.ModelType.Name(
        model.trainer_spec.model_type).lower()


def subword_sampling_error(kind, alpha):
    """Why subword sampling (`pipeline.SubwordSampler`) with `alpha` cannot train well on a
    SentencePiece model of type `kind` (`model_type`), in a few words; None where it can. A
    word or char model has one segmentation of a text to sample (sentencepiece refuses); a BPE
    model drops each merge with probability alpha, so alpha >= 1 drops every merge and trains
    on characters that no translation is segmented into."""
    if kind in ("word", "char"):
        return (f"a {kind} model has one segmentation of a text, so none to sample: "
                "use a unigram or BPE model, or drop --subword_alpha")
    if kind == "bpe" and alpha >= 1:
        return ("a BPE model drops each merge with this probability (BPE-dropout), so 1 or "
                "more drops every merge and trains on single characters: give a rate below 1 "
                "(the BPE-dropout paper's is 0.1)")
    return None


# Each side of a sample taking at most this share of its pieces with the other side's model
# marks two --vocab models given the other way round (`swapped_side_models`).
SWAPPED_SHARE = 0.75


def swapped_side_models(source_model, target_model, pairs):
    """Whether a source and a target SentencePiece model look given the other way round: each
    side of `pairs` tokenizes into at most SWAPPED_SHARE of its pieces with the other side's
    model. (On the embedded corpus, models learned on German alone and on English alone take
    1.7-2.6x the pieces on the other language; one learned on both against one learned on a
    side's language alone, 1.05x on that side.)

    Args:
      source_model, target_model: SentencePiece model files, as given.
      pairs: (source, target) strings, a sample of the training pairs.

    Returns:
      None, or the evidence: {"source": (pieces with source_model, with target_model),
      "target": (pieces with target_model, with source_model)}.
    """
    import sentencepiece

    if not pairs:
        return None
    sources, targets = (list(side) for side in zip(*pairs))
    source = sentencepiece.SentencePieceProcessor(model_file=source_model)
    target = sentencepiece.SentencePieceProcessor(model_file=target_model)

    def pieces(model, texts):
        return sum(len(ids) for ids in model.encode(texts))

    counts = {"source": (pieces(source, sources), pieces(target, sources)),
              "target": (pieces(target, targets), pieces(source, targets))}
    if all(other <= SWAPPED_SHARE * own for own, other in counts.values()):
        return counts
    return None


def write_protos(directory, protos):
    """Writes a vocabulary's files into `directory`, each atomically (a kill mid-copy leaves the
    old file or the new one), and removes those of the other layout, so that the files present
    say which vocabulary the directory has.

    Args:
      directory: an existing directory.
      protos: `VocabularyProtos` (or what `as_protos` takes).

    Returns:
      {"source": path, "target": path}.
    """
    protos = as_protos(protos)
    names = file_names(not protos.shared)
    for side in ("source", "target") if names["source"] != names["target"] else ("source",):
        write_atomically(os.path.join(directory, names[side]), getattr(protos, side))
    for stale in set(file_names(protos.shared).values()) - set(names.values()):
        if os.path.exists(os.path.join(directory, stale)):
            os.remove(os.path.join(directory, stale))
    return {side: os.path.join(directory, names[side]) for side in names}


def readable_fingerprint(source_path, target_path):
    """The fingerprint of a vocabulary's files, or None if one is missing or not a SentencePiece
    model."""
    from google.protobuf.message import DecodeError

    try:
        protos = []
        for path in (source_path, target_path):
            with open(path, "rb") as f:
                protos.append(f.read())
        return VocabularyProtos(*protos).fingerprint
    except (OSError, DecodeError):
        return None


class Vocabulary:
    """A vocabulary's tokenizers: `source` tokenizes what is translated, `target` what is
    produced (one `Tokenizer` object when shared).

    Args:
      source_path, target_path: SentencePiece model files (the same path when shared).

    Example:
      vocabulary = Vocabulary.from_dir("runs/de-en", separate=False)
      vocabulary.source.tokenize(["Guten Morgen."])
    """

    def __init__(self, source_path, target_path):
        from tfnmt.data.tokenizer import Tokenizer

        self.source = Tokenizer(source_path)
        self.target = self.source if target_path == source_path else Tokenizer(target_path)
        self.shared = self.source.fingerprint == self.target.fingerprint
        self.fingerprint = combined_fingerprint(self.source.fingerprint, self.target.fingerprint)
        self.protos = VocabularyProtos(self.source.model_proto, self.target.model_proto)

    @classmethod
    def from_dir(cls, directory, separate):
        return cls(*paths(directory, separate))

    def model_sizes(self):
        """The `Transformer` arguments of its sizes: vocab_size if shared, else
        source_vocab_size and target_vocab_size."""
        if self.shared:
            return {"vocab_size": self.source.vocab_size}
        return {"vocab_size": None, "source_vocab_size": self.source.vocab_size,
                "target_vocab_size": self.target.vocab_size}
