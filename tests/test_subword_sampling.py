"""Subword regularization in the input pipeline, against the `sentencepiece` package."""
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
