import hashlib
import os
import re
import sys
import unicodedata

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf
from sentencepiece import sentencepiece_model_pb2

from tfnmt import paths
from tfnmt.data import corpus, records, tokenizer
from tfnmt.paths import VOCAB
from tfnmt.data.tokenizer import (BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer,
                                  normalization_for, padded_with_ends, to_source_ids)


def test_special_ids_are_reserved(small_prepared):
    tokenizer = Tokenizer(os.path.join(small_prepared, VOCAB))
    pieces = tokenizer.id_to_piece([PAD_ID, UNK_ID, BOS_ID, EOS_ID]).numpy().tolist()
    assert pieces == [b"<pad>", b"<unk>", b"<s>", b"</s>"]
    assert tokenizer.vocab_size == 600
    ids = tokenizer.tokenize(["Das ist ein Haus."]).flat_values.numpy()
    assert not np.isin(ids, [PAD_ID, BOS_ID, EOS_ID]).any()


def test_round_trip_on_the_corpus(small_prepared):
    path = os.path.join(small_prepared, VOCAB)
    tokenizer = Tokenizer(path)
    normalizer = spm.SentencePieceNormalizer(model_file=path)
    dev = os.path.join(paths.EMBEDDED_DIR, "dev.tsv.gz")
    texts = [t for pair in corpus.read_tsv(dev, columns=3) for t in pair]
    detokenized = tokenizer.detokenize(tokenizer.tokenize(texts)).numpy()
    # The normaliser writes spaces as U+2581 and adds a leading one; detokenizing undoes both.
    expected = [normalizer.normalize(t).replace("\u2581", " ").strip().encode("utf-8")
                for t in texts]
    mismatches = [(e, d) for e, d in zip(expected, detokenized) if e != d]
    assert not mismatches, mismatches[:3]
    # Normalisation is light: nearly every sentence comes back byte-identical.
    identical = sum(d == t.encode("utf-8") for t, d in zip(texts, detokenized))
    assert identical / len(texts) > 0.95


def test_unknown_characters_and_bad_bytes_do_not_crash(small_prepared):
    tokenizer = Tokenizer(os.path.join(small_prepared, VOCAB))
    texts = tf.constant(["Grüße 😀 中文 ŋ", b"kaputt \xff\xfe bytes", ""])
    ids = tokenizer.tokenize(texts)
    assert UNK_ID not in ids.flat_values.numpy()  # byte fallback, not <unk>
    out = tokenizer.detokenize(ids).numpy().tolist()
    assert out[0] == "Grüße 😀 中文 ŋ".encode("utf-8")
    assert out[1].startswith(b"kaputt") and out[1].endswith(b"bytes")
    out[1].decode("utf-8")  # the result is valid UTF-8
    assert out[2] == b""


def test_detokenize_dense_stops_at_eos_and_ignores_padding(small_prepared):
    tokenizer = Tokenizer(os.path.join(small_prepared, VOCAB))
    ids = tokenizer.tokenize(["Guten Morgen.", "Ja."]).to_list()
    dense = [ids[0] + [EOS_ID, 57, 58],
             ids[1] + [EOS_ID] + [PAD_ID] * (len(ids[0]) + 2 - len(ids[1]))]
    assert tokenizer.detokenize(tf.constant(dense)).numpy().tolist() == [b"Guten Morgen.", b"Ja."]


def test_a_vocabulary_the_text_cannot_give_is_one_clear_error(tmp_path):
    from tfnmt.data.tokenizer import train_sentencepiece

    # In --vocab_size's terms: SentencePiece's own advice names options tfnmt does not have.
    sentences = ["Zimmer 1 ist frei.", "Room 1 is free."] * 50
    with pytest.raises(ValueError, match=r"^vocabulary size 5,000 does not fit the training "
                                         r"text: it can give at most \d+ pieces "
                                         r"\(--vocab_size\)$"):
        train_sentencepiece(sentences, str(tmp_path / "spm.model"), vocab_size=5000)
    characters = len(set("".join(sentences)))  # 13, the space included
    with pytest.raises(ValueError, match=r"^vocabulary size 12 does not fit the training text: "
                                         r"it needs at least (\d+) pieces \(one per character, "
                                         r"256 for bytes, the special ones\): give "
                                         r"--vocab_size=\1 or more$") as refused:
        train_sentencepiece(sentences, str(tmp_path / "spm.model"), vocab_size=12)
    assert int(re.search(r"least (\d+)", str(refused.value))[1]) >= characters + 256
    with pytest.raises(ValueError, match="no training text"):
        train_sentencepiece([], str(tmp_path / "spm.model"), vocab_size=100)
    assert os.listdir(tmp_path) == []  # nothing half-made is left


def test_an_input_error_while_learning_the_vocabulary_is_raised_as_it_was(tmp_path):
    # A bad corpus line found while SentencePiece reads the text (a CorpusError naming its file
    # and line) reaches the caller itself, not inside SentencePiece's RuntimeError.
    from tfnmt.data.corpus import CorpusError
    from tfnmt.data.tokenizer import train_sentencepiece

    error = CorpusError("train.de:51: not UTF-8")

    def sentences():
        yield from ["Zimmer 1 ist frei.", "Room 1 is free."] * 25
        raise error

    with pytest.raises(CorpusError) as raised:
        train_sentencepiece(sentences(), str(tmp_path / "spm.model"), vocab_size=100)
    assert raised.value is error
    assert os.listdir(tmp_path) == []  # nothing half-made is left
    with pytest.raises(ValueError, match="model_type must be 'unigram' or 'bpe', got 'word'"):
        train_sentencepiece(["a"], str(tmp_path / "spm.model"), model_type="word")


def test_an_interrupted_vocabulary_leaves_no_files(tmp_path, monkeypatch):
    # Ctrl-C once SentencePiece has written its files, before the model is in place.
    from tfnmt.data import tokenizer

    def interrupted(proto):
        raise KeyboardInterrupt

    monkeypatch.setattr(tokenizer, "portable_model_proto", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tokenizer.train_sentencepiece(["Zimmer 1 ist frei.", "Room 1 is free."] * 50,
                                      str(tmp_path / "spm.model"), vocab_size=274)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("rows", [[[5, 6, 7], [], [8]], [[], []], []])
@pytest.mark.parametrize("start_id, end_id", [(None, EOS_ID), (BOS_ID, None), (BOS_ID, EOS_ID)])
def test_padded_with_ends_frames_each_row_and_pads(rows, start_id, end_id):
    ragged = tf.ragged.constant(rows, dtype=tf.int64, ragged_rank=1, inner_shape=())
    framed = [([start_id] if start_id is not None else []) + row
              + ([end_id] if end_id is not None else []) for row in rows]
    width = max(map(len, framed), default=(start_id is not None) + (end_id is not None))
    expected = np.array([row + [PAD_ID] * (width - len(row)) for row in framed],
                        np.int32).reshape(len(rows), width)
    ids = padded_with_ends(ragged, start_id, end_id)
    assert ids.dtype == tf.int32
    np.testing.assert_array_equal(ids.numpy(), expected)


def test_source_ids_are_cut_then_end_with_eos():
    ragged = tf.ragged.constant([[5, 6, 7, 8, 9], [5], []], dtype=tf.int64)
    np.testing.assert_array_equal(to_source_ids(ragged, max_length=4).numpy(),
                                  [[5, 6, 7, EOS_ID], [5, EOS_ID, PAD_ID, PAD_ID],
                                   [EOS_ID, PAD_ID, PAD_ID, PAD_ID]])


def chinese_cipher(sentence, pool=150):
    """English written as a stand-in for Chinese: each word a run of 1-2 Han characters,
    no spaces, fullwidth punctuation."""
    marks = {",": "\uff0c", ".": "\u3002", "?": "\uff1f", "!": "\uff01", ":": "\uff1a",
             ";": "\uff1b"}
    out = []
    for word in re.findall(r"\w+|[^\w\s]", sentence.lower()):
        if word[0].isalnum():
            code = int(hashlib.md5(word.encode()).hexdigest(), 16)
            out.append("".join(chr(0x4E00 + (code >> (8 * k)) % pool)
                               for k in range(1 + code % 2)))
        else:
            out.append(marks.get(word, word))
    return "".join(out)


def test_targets_written_with_fullwidth_punctuation_keep_it(small_corpus, tmp_path):
    # NFKC (SentencePiece's default normalization) turns Chinese text's "，" into ",": the
    # model could not write what every reference holds. The vocabulary of such targets keeps
    # text as written, and its tokenizer (the one the SavedModel runs) gives it back.
    files = {}
    for split in ("train", "dev"):
        pairs = corpus.read_tsv(small_corpus[split], columns=3)
        files[split] = str(tmp_path / f"{split}.tsv")
        with open(files[split], "w", encoding="utf-8") as f:
            f.writelines(f"{source}\t{chinese_cipher(target)}\n" for source, target in pairs)
    model = sentencepiece_model_pb2.ModelProto()
    chinese = str(tmp_path / "chinese")
    records.prepare(chinese, dataset="files", files=files, vocab_size=800, train_shards=1)
    with open(os.path.join(chinese, VOCAB), "rb") as f:
        model.ParseFromString(f.read())
    assert model.normalizer_spec.name == "user_defined"
    assert not model.normalizer_spec.normalization_rule_tsv
    tokenizer = Tokenizer(os.path.join(chinese, VOCAB))
    targets = [target for _, target in corpus.read_tsv(files["dev"])][:50]
    assert sum("\uff0c" in target for target in targets) > 10
    written = tokenizer.detokenize(tokenizer.tokenize(targets)).numpy()
    assert [text.decode() for text in written] == targets
    # Only Unicode's other spaces are unified, as NFKC does: a no-break space is a space.
    spaced = tokenizer.detokenize(tokenizer.tokenize(["\uff21\u00a0\uff22\u3000x"])).numpy()
    assert spaced[0].decode() == "\uff21 \uff22 x"
    # Targets NFKC leaves as they are keep it: German-English text is normalized as before.
    german = str(tmp_path / "german")
    records.prepare(german, dataset="files", files=small_corpus, vocab_size=600, train_shards=1)
    with open(os.path.join(german, VOCAB), "rb") as f:
        model.ParseFromString(f.read())
    assert model.normalizer_spec.name == "nmt_nfkc"


CHANGED, SAME = "他喜欢读书\uff0c也喜欢写作\u3002", "他喜欢读书\u3002"


@pytest.mark.parametrize("targets, expected", [
    ([CHANGED] * 9 + [SAME] * 91, ("nmt_nfkc", 0.09)),
    ([CHANGED] * 10 + [SAME] * 90, ("spaces", 0.10)),
    (["Und Gott sprach: Es werde Licht."] * 100, ("nmt_nfkc", 0.0)),
    (["Et Dieu dit\u00a0: Que la lumi\u00e8re soit\u202f!"] * 100, ("nmt_nfkc", 0.0)),
    ([SAME] * 1000 + [CHANGED] * 1000, ("nmt_nfkc", 0.0)),   # the first 1,000 are read
    ([], ("nmt_nfkc", 0.0)),
])
def test_normalization_follows_how_many_targets_nfkc_would_rewrite(targets, expected):
    assert unicodedata.normalize("NFKC", CHANGED) != CHANGED
    assert unicodedata.normalize("NFKC", SAME) == SAME
    rule, share = normalization_for(iter(targets))
    assert (rule, round(share, 6)) == expected


def test_a_models_fingerprint_does_not_depend_on_where_it_was_trained(small_prepared):
    # The same model trained from files in two directories (SentencePiece records the input
    # files, the output prefix and a rule file's path): one fingerprint. What makes a model
    # tokenize otherwise (a piece's score) changes it.
    from tfnmt.data.tokenizer import fingerprint

    with open(os.path.join(small_prepared, VOCAB), "rb") as f:
        proto = f.read()
    copies = []
    for root in ("/a", "/b"):
        model = sentencepiece_model_pb2.ModelProto.FromString(proto)
        model.trainer_spec.model_prefix = f"{root}/spm"
        model.trainer_spec.input.append(f"{root}/train.txt")
        model.normalizer_spec.normalization_rule_tsv = f"{root}/rules.tsv"
        model.denormalizer_spec.normalization_rule_tsv = f"{root}/rules.tsv"
        copies.append(model.SerializeToString())
    assert copies[0] != copies[1]
    assert fingerprint(copies[0]) == fingerprint(copies[1]) == fingerprint(proto)
    model.pieces[10].score += 1.0
    assert fingerprint(model.SerializeToString()) != fingerprint(proto)


def test_decoder_outputs_are_cut_at_their_first_eos_without_padding():
    # Against a loop over the rows: the tokens before the first EOS, PAD left out (a finished
    # search writes PAD after EOS; a stopped one may leave PAD inside).
    from tfnmt.data.tokenizer import strip_output

    rows = [[5, 6, EOS_ID, 7, PAD_ID], [EOS_ID, 5, 6, 7, 8], [5, PAD_ID, 6, 7, 8],
            [PAD_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID], [9, 8, 7, EOS_ID, EOS_ID]]
    expected = []
    for row in rows:
        kept = []
        for token in row:
            if token == EOS_ID:
                break
            if token != PAD_ID:
                kept.append(token)
        expected.append(kept)
    assert strip_output(tf.constant(rows)).to_list() == expected


def test_the_saved_models_and_ctranslate2s_content_rules_agree_on_every_code_point():
    # A sentence with no character that carries text is answered with "" by both decoders:
    # the SavedModel's graph tells it with RE2's Unicode classes, translate.py's CTranslate2
    # path with Python's unicodedata. Each code point alone, through both:
    from tfnmt.inference import ctranslate2_translator

    chars = [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]
    graph = tokenizer.has_content(tf.constant(chars)).numpy()
    python = np.array([ctranslate2_translator.has_content(c) for c in chars])
    assert graph.sum() > 250_000 and (~graph).sum() > 150  # letters, marks, digits, symbols...
    # They may differ only where their Unicode versions do: at code points Python's tables
    # leave unassigned. Not at the format controls U+13439-U+1343F of Unicode 15, which
    # Python 3.11's tables (Unicode 14) lack: the CTranslate2 path names them itself.
    differing = [c for c, ours, theirs in zip(chars, graph, python) if ours != theirs]
    assert all(unicodedata.category(c) == "Cn" for c in differing) and len(differing) < 20
    format_controls = [chr(c) for c in range(0x13439, 0x13440)]
    assert not tokenizer.has_content(tf.constant(format_controls)).numpy().any()
    assert not any(ctranslate2_translator.has_content(c) for c in format_controls)
    # The rule on whole sentences: blanks of every kind, controls, format characters (zero
    # width space, BOM, soft hyphen, word joiner) and U+FFFD carry none; one letter is enough.
    cases = {"": False, " \t\n": False, "\u00a0\u3000\u2028\u2029\u0085": False,
             "\u200b\ufeff\u00ad\u2060": False, "\ufffd\ufffd": False, "\x00\x1b": False,
             " x ": True, "\u200b.\u200b": True, "\u0301": True, "\u4e00": True, "\U0001f600": True}
    found = tokenizer.has_content(tf.constant(list(cases))).numpy().tolist()
    assert found == list(cases.values())
    assert [ctranslate2_translator.has_content(text) for text in cases] == list(cases.values())
