"""The decoding toolbox: random sampling, n-best lists and forced-decoding scores, as library
calls and from translate.py."""
import os

import numpy as np
import pytest
import tensorflow as tf

from helpers import output_log_probs, python, teacher_forced_log_prob
from tfnmt.checkpoints import load_model
from tfnmt.data.special_tokens import PAD_ID
from tfnmt.data.tokenizer import Tokenizer, to_source_ids
from tfnmt.inference.beam_search import beam_search
from tfnmt.inference.greedy_search import (SamplingSearch, batch_major, greedy_decode,
                                          sample_decode)
from tfnmt.inference.serving import TranslationModule

SOURCES = ["Das ist ein Haus.", "Er sprach zu ihnen.", "Guten Morgen!", "Ja."]


@pytest.fixture(scope="module")
def model_and_ids(tiny_model_dir):
    model, _, _ = load_model(tiny_model_dir)
    tokenizer = Tokenizer(os.path.join(tiny_model_dir, "spm.model"))
    return model, to_source_ids(tokenizer.tokenize(SOURCES), model.max_length)


@pytest.mark.parametrize("steps, batch", [(5, 3), (1, 1), (4, 1), (1, 6)])
def test_batch_major_is_the_transpose(steps, batch):
    step_major = np.random.default_rng(steps * 10 + batch).integers(0, 1000, (steps, batch))
    np.testing.assert_array_equal(batch_major(tf.constant(step_major, tf.int32)).numpy(),
                                  step_major.T)


@pytest.mark.parametrize("temperature, top_k", [(1.0, 0), (0.5, 0), (2.0, 3)])
def test_sampling_draws_from_the_tempered_top_k_distribution(temperature, top_k):
    # 20,000 sentences at one step, all with the same 5-token distribution: the drawn tokens'
    # frequencies against softmax(log p / T) over the k most likely, computed in numpy.
    log_p = np.log(np.array([0.4, 0.3, 0.15, 0.1, 0.05]))
    rows = 20000
    strategy = SamplingSearch(vocab_size=5, temperature=temperature, top_k=top_k, seed=3)

    def log_probs_of(count):
        order = np.argsort(-log_p)[:count]
        return (tf.constant(np.tile(log_p[order], (rows, 1)), tf.float32),
                tf.constant(np.tile(order, (rows, 1)), tf.int32))

    sentences = {"index": tf.range(rows)}
    chosen_log_probs, tokens = strategy.choose(tf.constant(0), log_probs_of, sentences, rows)
    counts = np.bincount(tokens.numpy(), minlength=5) / rows
    kept = np.argsort(-log_p)[:top_k or 5]
    expected = np.zeros(5)
    expected[kept] = np.exp(log_p[kept] / temperature) / np.exp(log_p[kept] / temperature).sum()
    np.testing.assert_allclose(counts, expected, atol=0.015)  # ~4 standard deviations
    # The score of a drawn token is the model's log-probability of it.
    np.testing.assert_allclose(chosen_log_probs.numpy(), log_p[tokens.numpy()], rtol=1e-6)


def test_sampling_is_reproducible_and_top_1_is_greedy(model_and_ids):
    model, source_ids = model_and_ids
    limit = 12  # eager decoding steps in Python up to the limit: a short one keeps it quick
    first = sample_decode(model, source_ids, seed=5, max_length=limit)
    again = sample_decode(model, source_ids, seed=5, max_length=limit)
    other = sample_decode(model, source_ids, seed=6, max_length=limit)
    np.testing.assert_array_equal(first[0], again[0])
    assert not np.array_equal(first[0].numpy(), other[0].numpy())
    greedy_ids, greedy_scores = greedy_decode(model, source_ids, max_length=limit)
    top_1_ids, top_1_scores = sample_decode(model, source_ids, top_k=1, seed=9,
                                            max_length=limit)
    np.testing.assert_array_equal(top_1_ids, greedy_ids)
    np.testing.assert_allclose(top_1_scores, greedy_scores, rtol=1e-6)
    with pytest.raises(ValueError, match="temperature"):
        SamplingSearch(10, temperature=0.0)


def test_a_sentences_draws_do_not_depend_on_which_batch_mates_are_still_searched(
        model_and_ids):
    # Each row draws its own noise (seed, search, step, row): the first sentence stopped
    # after one step leaves the draws, and so the outputs, of the others as they were.
    model, source_ids = model_and_ids
    limit = 12
    together = sample_decode(model, source_ids, seed=5, max_length=limit)
    first_stopped = sample_decode(model, source_ids, seed=5, max_length=[1] + [limit] * 3)
    assert not np.any(first_stopped[0][0][1:] != PAD_ID)  # one token drawn, then nothing
    for row in range(1, len(SOURCES)):
        assert [t for t in first_stopped[0][row].numpy() if t != PAD_ID] == \
            [t for t in together[0][row].numpy() if t != PAD_ID], row
    np.testing.assert_allclose(first_stopped[1][1:], together[1][1:], rtol=1e-5)


def test_each_search_of_a_sampling_module_draws_anew(tiny_model_dir):
    # Back-translation draws from many batches: translate.py makes a request of each, a module
    # a search of each chunk of a request. No two searches may share their noise: one
    # sentence 12 times, in 3 chunks, in each of 2 requests, is 24 independent draws, and a new
    # module of the same seed repeats them all.
    model, vocab, _ = load_model(tiny_model_dir)

    def two_requests():
        module = TranslationModule(model, vocab, n_best=1, chunk_size=4, max_decode_length=8,
                                   sampling={"temperature": 2.0, "top_k": 0, "seed": 4})
        return [module.translate_batch(tf.constant(SOURCES[:1] * 12), 1)[0][:, 0].numpy()
                .tolist() for _ in range(2)]

    first, again = two_requests(), two_requests()
    assert first == again
    # Searches sharing their noise would give 4 (a chunk's rows), each 6 times.
    assert len(set(first[0] + first[1])) >= 20


PREFIXES = ["That is", "", "Good morning to", "Yes"]


def test_a_prefix_is_forced_and_scored_as_the_model_scores_it(model_and_ids, tiny_model_dir):
    model, source_ids = model_and_ids
    tokenizer = Tokenizer(os.path.join(tiny_model_dir, "spm.model"))
    prefix = tf.cast(tokenizer.tokenize(PREFIXES), tf.int32).to_tensor(0)  # [B, P]
    lengths = np.sum(prefix.numpy() != 0, axis=1)
    greedy_ids, greedy_scores = greedy_decode(model, source_ids, prefix=prefix)
    beam_ids, _ = beam_search(model, source_ids, beam_size=3, n_best=2, prefix=prefix)
    sampled_ids, _ = sample_decode(model, source_ids, seed=1, prefix=prefix)
    for i, n in enumerate(lengths):
        expected = prefix.numpy()[i, :n].tolist()
        assert greedy_ids.numpy()[i, :n].tolist() == expected
        assert sampled_ids.numpy()[i, :n].tolist() == expected
        for hypothesis in beam_ids.numpy()[i]:
            assert hypothesis[:n].tolist() == expected
    # The greedy score, prefix included, is the log-probability of its output (EOS included
    # where it ended) under teacher forcing, in float64 numpy over the model's logits. The
    # untrained model ends no sentence here, so each output runs to its limit.
    for i, row in enumerate(greedy_ids.numpy()):
        tokens = [int(t) for t in row if t != PAD_ID]
        expected = output_log_probs(model, source_ids[i:i + 1], tokens).sum()
        assert float(greedy_scores[i]) == pytest.approx(expected, rel=1e-4, abs=1e-4), i


def test_translate_py_n_best_sampling_and_scores(tiny_model_dir, tmp_path):
    source = tmp_path / "in.de"
    source.write_text("".join(s + "\n" for s in SOURCES), encoding="utf-8")
    model_flags = [f"--model_dir={tiny_model_dir}", f"--input={source}"]

    result = python("translate.py", *model_flags, "--beam_size=3", "--n_best=3")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line.split(" ||| ") for line in result.stdout.splitlines()]
    assert [int(i) for i, _, _ in lines] == [i for i in range(len(SOURCES)) for _ in range(3)]
    for i in range(len(SOURCES)):
        scores = [float(s) for _, _, s in lines[3 * i:3 * i + 3]]
        assert scores == sorted(scores, reverse=True)

    # (Other seeds draw other translations: test_sampling_is_reproducible_and_top_1_is_greedy.)
    sampled = [python("translate.py", *model_flags, "--sampling_topk=0", "--seed=1")
               for _ in range(2)]
    assert all(r.returncode == 0 for r in sampled), sampled[0].stderr[-3000:]
    assert sampled[0].stdout == sampled[1].stdout
    # A line ends at "\n" only: a drawn translation may hold other line breaks (VT, U+001C...).
    sampled_lines = sampled[0].stdout.split("\n")
    assert len(sampled_lines) == len(SOURCES) + 1 and sampled_lines[-1] == ""

    # Scores of given translations (here: the sampled ones), against numpy over the logits.
    targets = tmp_path / "targets.en"
    targets.write_text(sampled[0].stdout, encoding="utf-8")
    scored = python("translate.py", *model_flags, f"--score_targets={targets}")
    assert scored.returncode == 0, scored.stderr[-3000:]
    model, proto, _ = load_model(tiny_model_dir)
    for line, src, tgt in zip(scored.stdout.splitlines(), SOURCES, sampled_lines):
        log_prob, length = line.split("\t")
        expected, expected_length = teacher_forced_log_prob(model, proto, src, tgt)
        assert int(length) == expected_length
        assert float(log_prob) == pytest.approx(expected, rel=1e-4, abs=1e-4)

    # Prefixes, one per line: each translation starts with its own, verbatim.
    prefixes = tmp_path / "prefixes.en"
    prefixes.write_text("".join(p + "\n" for p in PREFIXES), encoding="utf-8")
    prefixed = python("translate.py", *model_flags, f"--target_prefix={prefixes}")
    assert prefixed.returncode == 0, prefixed.stderr[-3000:]
    for line, prefix in zip(prefixed.stdout.splitlines(), PREFIXES):
        assert line.startswith(prefix), (line, prefix)

    refused = python("translate.py", *model_flags, "--n_best=5")
    assert refused.returncode == 1 and "--n_best=5 needs --beam_size >= 5" in refused.stderr
