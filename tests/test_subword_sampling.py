"""Subword regularization in the input pipeline, against the `sentencepiece` package."""
import os

import numpy as np
import pytest
import sentencepiece as spm

from tfnmt.data import pipeline, records
from tfnmt.data.special_tokens import BOS_ID, EOS_ID


def read_pairs(data_dir, sampler, max_length=256, count=800):
    """The train split's first `count` pairs in record order as (source ids, target ids),
    specials removed."""
    manifest = records.load_manifest(data_dir)
    dataset = pipeline.model_inputs(data_dir, manifest, "train", max_length=max_length,
                                    shuffle=False, subword_sampler=sampler)
    pairs = []
    for example in dataset.take(count):
        source, target_in, target_out = (example[k].numpy().tolist()
                                         for k in ("source", "target_in", "target_out"))
        assert source[-1] == EOS_ID and target_in[0] == BOS_ID and target_out[-1] == EOS_ID
        assert target_in[1:] == target_out[:-1]
        pairs.append((source[:-1], target_out[:-1]))
    return pairs


def processors(data_dir):
    vocabulary = records.manifest_vocabulary(data_dir, records.load_manifest(data_dir))
    return vocabulary, tuple(spm.SentencePieceProcessor(model_proto=tokenizer.model_proto)
                             for tokenizer in (vocabulary.source, vocabulary.target))


@pytest.mark.parametrize("prepared", ["small_prepared", "separate_prepared"])
def test_sampled_segmentations_spell_every_pair_and_vary(prepared, request):
    data_dir = request.getfixturevalue(prepared)
    vocabulary, (source_sp, target_sp) = processors(data_dir)
    best = read_pairs(data_dir, None)
    sampler = pipeline.SubwordSampler(vocabulary, alpha=0.1, nbest=64)
    first, second = read_pairs(data_dir, sampler), read_pairs(data_dir, sampler)
    assert len(first) == len(second) == len(best) == 800
    for (source, target), (best_source, best_target) in zip(first, best):
        # Each side decodes, with its own model, to the text of its best segmentation.
        assert source_sp.decode(source) == source_sp.decode(best_source)
        assert target_sp.decode(target) == target_sp.decode(best_target)
    # Words are split anew at each read: most pairs differ from the best and between reads.
    assert np.mean([a != b for a, b in zip(first, best)]) > 0.8
    assert np.mean([a != b for a, b in zip(first, second)]) > 0.8


def test_sampled_lengths_match_sentencepieces_own_sampling(small_prepared):
    vocabulary, (sp, _) = processors(small_prepared)
    best = read_pairs(small_prepared, None)
    texts = [sp.decode(source) for source, _ in best]
    sampled = read_pairs(small_prepared, pipeline.SubwordSampler(vocabulary, alpha=0.2, nbest=-1))
    ours = sum(len(source) for source, _ in sampled)
    reference = sum(len(sp.encode(text, enable_sampling=True, alpha=0.2, nbest_size=-1))
                    for text in texts)
    shortest = sum(len(source) for source, _ in best)
    assert ours > 1.05 * shortest  # sampled segmentations are longer than the best ones
    assert ours == pytest.approx(reference, rel=0.03)  # 800 sentences: ~0.6% spread


def test_the_length_filter_sees_the_sampled_lengths(small_prepared):
    vocabulary, _ = processors(small_prepared)
    sampler = pipeline.SubwordSampler(vocabulary, alpha=0.05, nbest=-1)  # ~2x the pieces
    for source, target in read_pairs(small_prepared, sampler, max_length=40):
        assert max(len(source), len(target)) + 1 <= 40


@pytest.mark.parametrize("alpha, nbest", [(0.0, 64), (-0.1, 64), (0.1, 0), (0.1, -2)])
def test_bad_sampling_settings_are_refused(small_prepared, alpha, nbest):
    vocabulary, _ = processors(small_prepared)
    with pytest.raises(ValueError):
        pipeline.SubwordSampler(vocabulary, alpha=alpha, nbest=nbest)


def english_model(small_corpus, directory, model_type, vocab_size):
    """A SentencePiece model of `model_type` learned by the sentencepiece package on the small
    corpus' English side, with tfnmt's reserved ids."""
    with open(small_corpus["train"], encoding="utf-8") as f:
        english = [line.rstrip("\n").split("\t")[1] for line in f]
    prefix = os.path.join(directory, model_type)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(english), model_prefix=prefix,
                                   model_type=model_type, vocab_size=vocab_size, pad_id=0,
                                   unk_id=1, bos_id=2, eos_id=3, hard_vocab_limit=False,
                                   minloglevel=2)
    return prefix + ".model"


def test_vocabularies_sampling_cannot_train_with_are_refused(small_corpus, tmp_path):
    from tfnmt.data.vocabulary import Vocabulary
    from tfnmt.training.experiment import SettingsError, _subword_sampler

    bpe, char = (english_model(small_corpus, tmp_path, kind, size)
                 for kind, size in (("bpe", 500), ("char", 100)))
    text = "The house of the people is not far from here."
    # sentencepiece's own sampling: a BPE model at alpha 1 drops every merge, down to single
    # characters (at 0.5 some merges stay); a char model has no segmentations to sample.
    bpe_sp, char_sp = (spm.SentencePieceProcessor(model_file=path) for path in (bpe, char))
    dropped = bpe_sp.encode(text, out_type=str, enable_sampling=True, alpha=1.0, nbest_size=-1)
    assert all(len(piece.replace("\u2581", "")) <= 1 for piece in dropped)
    assert len(bpe_sp.encode(text, out_type=str)) < len(text.split()) * 2 < len(dropped)
    with pytest.raises(RuntimeError, match="SampleEncode is not available"):
        char_sp.encode(text, enable_sampling=True, alpha=0.1, nbest_size=-1)

    with pytest.raises(ValueError, match="^the vocabulary's SentencePiece model: a BPE model "
                       "drops each merge with this probability"):
        pipeline.SubwordSampler(Vocabulary(bpe, bpe), alpha=1.0)
    pipeline.SubwordSampler(Vocabulary(bpe, bpe), alpha=0.5)
    with pytest.raises(SettingsError, match="^--subword_alpha=0.1: the target side's "
                       "SentencePiece model: a char model has one segmentation"):
        _subword_sampler(Vocabulary(bpe, char), {"subword_alpha": 0.1})
    assert _subword_sampler(Vocabulary(bpe, char), {"subword_alpha": 0.0}) is None


def test_train_py_refuses_sampling_the_flags_cannot_train_with(small_corpus, tmp_path):
    # Refused in one line before TensorFlow loads and before the model_dir holds anything: a BPE
    # vocabulary to learn with a merge-dropout rate of 1, or a given char model.
    from helpers import imported_modules, python

    char = english_model(small_corpus, tmp_path, "char", 100)
    data = [f"--train_files={small_corpus['train']}", f"--dev_files={small_corpus['dev']}"]
    for flags, line in (
            (["--vocab_type=bpe", "--subword_alpha=1"], "--subword_alpha=1: --vocab_type=bpe: a "
             "BPE model drops each merge with this probability (BPE-dropout), so 1 or more drops "
             "every merge and trains on single characters: give a rate below 1 (the "
             "BPE-dropout paper's is 0.1)"),
            ([f"--vocab={char}", "--subword_alpha=0.1"], f"--subword_alpha=0.1: --vocab's {char}: "
             "a char model has one segmentation of a text, so none to sample: use a unigram or "
             "BPE model, or drop --subword_alpha")):
        result = python("train.py", f"--model_dir={tmp_path / 'run'}", *data, *flags,
                        timeout=60, env={"PYTHONPROFILEIMPORTTIME": "1"})
        assert result.returncode == 1
        assert result.stderr.strip().splitlines()[-1] == f"train.py: {line}"
        assert "tensorflow" not in imported_modules(result.stderr)
        assert list((tmp_path / "run").iterdir()) == []  # no settings.json: other flags may run
