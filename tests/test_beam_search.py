import concurrent.futures
import contextlib
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import random_ids
from tfnmt import fast_ops
from tfnmt.data.special_tokens import BOS_ID, EOS_ID, PAD_ID
from tfnmt.inference.beam_search import (STOP_RULES, beam_search, beam_search_alphas,
                                        length_penalty)
from tfnmt.inference.decoding import (EXTRA_LENGTH, PLAIN_EXP_RANGE, greedy_decode_uncached,
                                      top_log_probs)
from tfnmt.inference.greedy_search import greedy_decode
from tfnmt.model import transformer
from tfnmt.model.presets import get_preset
from tfnmt.model.transformer import Transformer

VOCAB = 6  # two symbols besides the specials: EOS is likely, so hypotheses end at varied steps


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(3)  # Keras initialisers: independent of the tests run before
    model = Transformer(vocab_size=VOCAB, **get_preset("tiny", dropout=0.0))
    model.build()
    return model


@pytest.fixture(scope="module")
def source():
    ids = random_ids(np.random.default_rng(0), 3, 5, VOCAB)
    ids[1, 3:] = PAD_ID
    return tf.constant(ids)


def teacher_forced_log_prob(model, source, output):
    """Sum of log-probabilities of `output` (up to and including EOS) by full recomputation."""
    output = [t for t in output.tolist()]
    length = output.index(EOS_ID) + 1 if EOS_ID in output else len(output)
    tokens = output[:length]
    target_in = tf.constant([[BOS_ID] + tokens[:-1]])
    memory, padding = model.encode(source[None])
    log_probs = tf.nn.log_softmax(model.decode(target_in, memory, padding))[0].numpy()
    return sum(log_probs[i, t] for i, t in enumerate(tokens)), length


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_scores_equal_teacher_forced_log_probs_with_length_penalty(model, source, alpha):
    ids, scores = beam_search(model, source, beam_size=4, alpha=alpha, max_length=8, n_best=4)
    assert ids.shape[:2] == (3, 4)
    lengths = {teacher_forced_log_prob(model, source[b], ids[b, n].numpy())[1]
               for b in range(3) for n in range(4)}
    ended = [EOS_ID in row for row in ids.numpy().reshape(12, -1).tolist()]
    assert any(ended) and not all(ended) and len(lengths) >= 2  # finished and cut-off ones
    for b in range(3):
        for n in range(4):
            log_prob, length = teacher_forced_log_prob(model, source[b], ids[b, n].numpy())
            expected = log_prob / float(length_penalty(length, alpha))
            assert float(scores[b, n]) == pytest.approx(expected, rel=1e-4, abs=1e-4)


def repeats_an_ngram(tokens, n):
    """Whether `tokens` holds some n-gram twice."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) != len(set(grams))


_LOG_PROBS = weakref.WeakKeyDictionary()  # model: {(source, prefix): log-probabilities}


def next_token_log_probs(model, source, prefixes):
    """float64 [len(prefixes), V]: log P(next token | prefix, source) for each prefix (all of
    one length), the decoder re-run over the whole prefix (the prefixes not seen before as one
    batch). Remembered per model and source: searches of one sentence under another stop rule,
    alpha or n-gram rule ask for many of the same prefixes."""
    known = _LOG_PROBS.setdefault(model, {})
    sentence = source.numpy().tobytes()
    missing = [tokens for tokens in prefixes if (sentence, tokens) not in known]
    if missing:
        memory, padding = model.encode(source[None])
        rows = len(missing)
        logits = model.decode(tf.constant([[BOS_ID, *tokens] for tokens in missing]),
                              tf.repeat(memory, rows, 0), tf.repeat(padding, rows, 0))[:, -1]
        for tokens, row in zip(missing,
                               tf.nn.log_softmax(tf.cast(logits, tf.float64)).numpy()):
            known[sentence, tokens] = row
    return np.stack([known[sentence, tokens] for tokens in prefixes])


def reference_beam_search(model, source, k, alpha, limit, stop, no_repeat=0):
    """Beam search written plainly, one sentence: every step takes each alive prefix's
    next-token log-probabilities from the decoder re-run over the whole prefix
    (`next_token_log_probs`) and extends every alive hypothesis by every token, in float64
    numpy. Keeps the 2k best extensions (with no_repeat = n, of those that hold no n-gram
    twice), of which those ending in EOS are finished (scored log P / lp) and the k best others
    go on. Stops at `limit`, or once k have finished ("finished"), or once the best alive one
    under lp(limit) cannot beat the k-th finished ("bound"); at the limit the alive ones
    compete as they are. -> ([(tokens, score)] best first, steps taken)."""
    def lp(n):
        return ((5.0 + n) / 6.0) ** alpha

    alive, finished = [((), 0.0)], []
    for length in range(1, limit + 1):
        log_probs = next_token_log_probs(model, source, [tokens for tokens, _ in alive])
        extensions = [(tokens + (t,), log_prob + log_probs[i, t])
                      for i, (tokens, log_prob) in enumerate(alive) for t in range(VOCAB)
                      if not (no_repeat and repeats_an_ngram(tokens + (t,), no_repeat))]
        extensions = sorted(extensions, key=lambda e: -e[1])[:2 * k]
        finished = sorted(finished + [(t, p / lp(length)) for t, p in extensions
                                      if t[-1] == EOS_ID], key=lambda f: -f[1])[:k]
        alive = [e for e in extensions if e[0][-1] != EOS_ID][:k]
        if length == limit or not alive:  # not alive: every extension repeats an n-gram
            finished += [(t, p / lp(length)) for t, p in alive]
            break
        if len(finished) == k and (stop == "finished"
                                   or alive[0][1] / lp(limit) <= finished[-1][1]):
            break
    return sorted(finished, key=lambda f: -f[1])[:k], length


def assert_plain_search_results(ids, scores, expected, message=None):
    """A sentence's search results, ids [N, L] and scores [N], are `reference_beam_search`'s
    hypotheses `expected` [(tokens, score)], best first, PAD after each one's tokens."""
    for row, (tokens, _) in zip(ids.numpy().tolist(), expected):
        assert tuple(row[:len(tokens)]) == tokens, message
        assert set(row[len(tokens):]) <= {PAD_ID}, message
    np.testing.assert_allclose(scores, [score for _, score in expected], rtol=1e-5, atol=1e-5)


class WrappedModel:
    """A model with its decoder's logits changed by a subclass (`decode`, `decode_step`);
    the rest of what a search calls is the model's."""

    def __init__(self, model):
        self.model, self.settings = model, model.settings
        self.encode, self.initial_cache = model.encode, model.initial_cache
        self.decoding_products = model.decoding_products


class EosLikely(WrappedModel):
    """The model with EOS's logit raised by 1: hypotheses end at many different steps."""

    def __init__(self, model):
        super().__init__(model)
        self.bonus = tf.one_hot(EOS_ID, VOCAB)

    def decode(self, target_ids, memory, source_padding):
        return self.model.decode(target_ids, memory, source_padding) + self.bonus

    def decode_step(self, token_ids, step, cache, source_padding, return_attention=False):
        logits, cache = self.model.decode_step(token_ids, step, cache, source_padding)
        return logits + self.bonus, cache


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_both_stop_rules_give_what_a_plain_search_gives(model, alpha):
    # Eight sentences, searched in one batch; each compared with the plain search of it alone.
    model = EosLikely(model)
    source = random_ids(np.random.default_rng(4), 8, 5, VOCAB)
    source[::3, 2:] = PAD_ID
    source = tf.constant(source)
    steps = {}
    for stop in STOP_RULES:
        ids, scores = beam_search(model, source, beam_size=3, alpha=alpha, max_length=9,
                                  n_best=3, stop=stop)
        steps[stop] = []
        for b in range(8):
            expected, taken = reference_beam_search(model, source[b], 3, alpha, 9, stop)
            steps[stop].append(taken)
            assert_plain_search_results(ids[b], scores[b], expected, (stop, b))
            assert ids.shape[2] >= taken
    # The rules differ here: "finished" stops searches before "bound" does, and "bound"
    # stops some before the limit.
    assert all(f <= b for f, b in zip(steps["finished"], steps["bound"]))
    assert steps["finished"] != steps["bound"] and min(steps["bound"]) < 9


class Bigram(WrappedModel):
    """The model's decoder replaced by a bigram table: the next token's logits are
    `LOGITS[last token]`. After BOS, 4 leads 5 by 5 nats; after any other token, UNK, 4, 5 and
    EOS lie within 0.43 of each other, EOS the least likely (PAD and BOS far below). So from
    the second step on, a step's 2k best extensions all extend its best hypothesis."""

    UNUSED = [0.0] * VOCAB  # after PAD or EOS: never extended
    # Columns: PAD, UNK, BOS, EOS, 4, 5.
    LOGITS = np.array([UNUSED,  # after PAD
                       [-20.0, 0.37, -20.0, 0.0, 0.29, 0.11],  # after UNK
                       [-20.0, -20.0, -20.0, -30.0, 0.0, -5.0],  # after BOS
                       UNUSED,  # after EOS
                       [-20.0, 0.23, -20.0, 0.0, 0.41, 0.17],  # after 4
                       [-20.0, 0.31, -20.0, 0.0, 0.07, 0.43]], np.float32)  # after 5

    def decode(self, target_ids, memory, source_padding):
        return tf.gather(self.LOGITS, target_ids)  # [B, T, V]

    def decode_step(self, token_ids, step, cache, source_padding, return_attention=False):
        _, cache = self.model.decode_step(token_ids, step, cache, source_padding)
        return tf.gather(self.LOGITS, tf.reshape(token_ids, [-1])), cache


@pytest.mark.parametrize("stop", STOP_RULES)
def test_a_steps_best_extensions_may_all_extend_one_hypothesis(model, stop):
    # Each hypothesis offers the step its 2k best extensions, not only k: here the leader's
    # fourth, EOS, is the best finished hypothesis of all.
    bigram = Bigram(model)
    source = tf.constant(random_ids(np.random.default_rng(5), 2, 4, VOCAB))
    ids, scores = beam_search(bigram, source, beam_size=2, alpha=0.6, max_length=6, n_best=2,
                              stop=stop)
    for b in range(2):
        expected, _ = reference_beam_search(bigram, source[b], 2, 0.6, 6, stop)
        assert expected[0][0] == (4, EOS_ID)
        assert_plain_search_results(ids[b], scores[b], expected)


def test_an_unknown_stop_rule_is_refused(model, source):
    with pytest.raises(ValueError, match="stop"):
        beam_search(model, source, beam_size=2, stop="never")


def test_n_best_is_sorted_and_distinct(model, source):
    ids, scores = beam_search(model, source, beam_size=4, alpha=0.6, max_length=8, n_best=4)
    scores = scores.numpy()
    assert np.all(np.diff(scores, axis=1) <= 1e-6)
    for b in range(3):
        hypotheses = {tuple(t for t in row if t != PAD_ID) for row in ids[b].numpy().tolist()}
        assert len(hypotheses) == 4


def test_beam_of_one_is_greedy(model, source):
    greedy, greedy_scores = greedy_decode(model, source, max_length=8)
    beam, beam_scores = beam_search(model, source, beam_size=1, alpha=0.0, max_length=8)
    width = greedy.shape[1]
    np.testing.assert_array_equal(beam[:, 0, :width], greedy)
    assert np.all(beam.numpy()[:, 0, width:] == PAD_ID)
    np.testing.assert_allclose(beam_scores[:, 0], greedy_scores, rtol=1e-5)


def brute_force_best(model, source, limit, alpha, count):
    """The `count` best outputs of all there are up to `limit` tokens (those ending in EOS,
    and those cut at the limit), scored log P / lp(length) in float64 from one decoder pass
    per prefix length. -> [(tokens, score)], best first."""
    memory, padding = model.encode(source[None])
    symbols = [t for t in range(VOCAB) if t != EOS_ID]
    prefixes, log_prob = [()], {(): 0.0}
    outputs = []
    for length in range(1, limit + 1):
        rows = len(prefixes)
        logits = model.decode(tf.constant([[BOS_ID, *tokens] for tokens in prefixes]),
                              tf.repeat(memory, rows, 0), tf.repeat(padding, rows, 0))[:, -1]
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float64)).numpy()
        penalty = ((5.0 + length) / 6.0) ** alpha
        extended = []
        for i, tokens in enumerate(prefixes):
            outputs.append((tokens + (EOS_ID,), (log_prob[tokens] + log_probs[i, EOS_ID])
                            / penalty))
            for t in symbols:
                log_prob[tokens + (t,)] = log_prob[tokens] + log_probs[i, t]
                extended.append(tokens + (t,))
        prefixes = extended
    outputs += [(tokens, log_prob[tokens] / ((5.0 + limit) / 6.0) ** alpha)
                for tokens in prefixes]  # cut at the limit
    return sorted(outputs, key=lambda o: -o[1])[:count]


def test_a_beam_that_keeps_every_prefix_finds_the_best_outputs_of_all(model, source):
    # Beam search is exact once its beam holds every prefix: here at most 5**3 = 125 alive
    # (EOS ends a hypothesis), and the best 2k extensions at the last step hold the best of
    # that step's. Its n best are then the n best of all 781 outputs of up to 4 tokens (156
    # ending in EOS, 625 cut at the limit), each scored on its own.
    ids, scores = beam_search(model, source, beam_size=6 ** 3, alpha=0.6, max_length=4,
                              n_best=10, stop="bound")
    for b in range(source.shape[0]):
        expected = brute_force_best(model, source[b], 4, 0.6, 10)
        assert_plain_search_results(ids[b], scores[b], expected, b)
    # A beam of 2 misses the best output of some sentence here (the third's, by 0.28).
    _, narrow = beam_search(model, source, beam_size=2, alpha=0.6, max_length=4, stop="bound")
    assert np.any(narrow.numpy()[:, 0] < scores.numpy()[:, 0] - 1e-4)


def test_compiled_equals_eager(model, source):
    eager_ids, eager_scores = beam_search(model, source, beam_size=3, max_length=8, n_best=2)
    compiled = tf.function(lambda s: beam_search(model, s, beam_size=3, max_length=8, n_best=2))
    ids, scores = compiled(source)
    np.testing.assert_array_equal(ids, eager_ids)
    np.testing.assert_allclose(scores, eager_scores, rtol=1e-5)


def search_loop_ops(search, source):
    """The op types of the largest loop body (the search's) in the tf.function `search`'s
    graph for `source`."""
    graph_def = search.get_concrete_function(source).graph.as_graph_def()
    body = max((f for f in graph_def.library.function if "body" in f.signature.name),
               key=lambda f: len(f.node_def))
    return [node.op for node in body.node_def]


def test_a_search_step_projects_queries_keys_and_values_in_one_product(model, source):
    # Prepared once per search (`Transformer.decoding_products`), a layer's query, key and
    # value kernels side by side make one product per step: per decoder layer that, the
    # self-attention output, the cross-attention query and output and the two feed-forward
    # products; then the output layer.
    search = tf.function(lambda s: beam_search(model, s, beam_size=3, max_length=8))
    kinds = search_loop_ops(search, source)
    assert kinds.count("MatMul") == 6 * len(model.decoder_layers) + 1
    assert "Transpose" not in kinds


def test_bad_n_best_is_refused(model, source):
    with pytest.raises(ValueError, match="n_best"):
        beam_search(model, source, beam_size=2, n_best=3)


def test_attention_weights_follow_the_hypotheses(model, source):
    """Returned cross-attention rows equal the teacher-forced last-layer weights (mean over
    heads) of each hypothesis, and results are unchanged by asking for them."""
    ids, scores, attention = beam_search(model, source, beam_size=3, alpha=0.6, max_length=6,
                                         n_best=2, return_attention=True)
    plain_ids, plain_scores = beam_search(model, source, beam_size=3, alpha=0.6, max_length=6,
                                          n_best=2)
    np.testing.assert_array_equal(ids, plain_ids)
    np.testing.assert_allclose(scores, plain_scores, rtol=1e-6)
    assert attention.shape == (3, 2, ids.shape[2], source.shape[1])
    for b in range(3):
        for n in range(2):
            tokens = ids[b, n].numpy().tolist()
            length = tokens.index(EOS_ID) + 1 if EOS_ID in tokens else len(tokens)
            target_in = tf.constant([[BOS_ID] + tokens[:length - 1]])
            memory, padding = model.encode(source[b][None])
            _, weights = model.decode(target_in, memory, padding, return_attention_scores=True)
            expected = tf.reduce_mean(weights[-1]["cross"][0], axis=0).numpy()  # [T, S]
            np.testing.assert_allclose(attention[b, n, :length], expected, atol=1e-5)
    greedy_ids, _, greedy_attention = greedy_decode(model, source, max_length=6,
                                                    return_attention=True)
    assert greedy_attention.shape == (3, greedy_ids.shape[1], source.shape[1])
    np.testing.assert_allclose(tf.reduce_sum(greedy_attention, -1), 1.0, atol=1e-5)


class EndsAtSourceLength(WrappedModel):
    """The model, with EOS forbidden before an output as long as its source and all but
    forced there: the sentences of a batch end at different steps."""

    def decode_step(self, token_ids, step, cache, source_padding, return_attention=False):
        logits, cache = self.model.decode_step(token_ids, step, cache, source_padding)
        lengths = tf.reduce_sum(tf.cast(source_padding, tf.int32), axis=1)  # a row per sentence
        lengths = tf.repeat(lengths, tf.shape(logits)[0] // tf.shape(lengths)[0])  # per beam
        bonus = tf.where(step + 1 >= lengths, 20.0, -20.0)
        return logits + bonus[:, None] * tf.one_hot(EOS_ID, VOCAB), cache


def test_each_sentence_gets_what_it_gets_alone(model):
    # Sentences leave the batch when their search ends (beam) or they produce EOS (greedy); the
    # others go on. Each must get exactly what it gets in a batch of its own.
    lengths = [4, 2, 6, 3, 5, 1]
    source = random_ids(np.random.default_rng(7), 6, 6, VOCAB)
    for row, length in enumerate(lengths):
        source[row, length:] = PAD_ID
    source, model = tf.constant(source), EndsAtSourceLength(model)
    ids, scores = beam_search(model, source, beam_size=3, alpha=0.6, max_length=12, n_best=3)
    greedy, greedy_scores = greedy_decode(model, source, max_length=12)
    np.testing.assert_array_equal(np.argmax(ids.numpy()[:, 0] == EOS_ID, axis=1) + 1, lengths)
    np.testing.assert_array_equal(np.argmax(greedy.numpy() == EOS_ID, axis=1) + 1, lengths)
    for i in range(len(lengths)):
        alone, alone_scores = beam_search(model, source[i:i + 1], beam_size=3, alpha=0.6,
                                          max_length=12, n_best=3)
        length = alone.shape[2]
        np.testing.assert_array_equal(ids[i, :, :length], alone[0])
        assert np.all(ids.numpy()[i, :, length:] == PAD_ID)
        # A row's products round differently in batches of other sizes (kernels block by
        # shape); a score of 0 (a forced EOS) then comes out as a few ulps of 1.
        np.testing.assert_allclose(scores[i], alone_scores[0], rtol=1e-5, atol=1e-6)
        alone, alone_scores = greedy_decode(model, source[i:i + 1], max_length=12)
        np.testing.assert_array_equal(greedy[i, :alone.shape[1]], alone[0])
        assert np.all(greedy.numpy()[i, alone.shape[1]:] == PAD_ID)
        np.testing.assert_allclose(greedy_scores[i], alone_scores[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("vocab", [5, 37, 64, 1001])
@pytest.mark.parametrize("count", [1, 3, 8])
def test_top_log_probs_equal_top_k_of_log_softmax(vocab, count):
    rng = np.random.default_rng(vocab + count)
    logits = rng.normal(size=(6, vocab)).astype(np.float32) * 4
    logits[:, rng.integers(0, vocab, 4)] = 3.0  # ties, broken towards the lower id
    logits[1] = 0.0  # a row of ties only
    logits[2, :] = -30.0
    logits[2, -1] = 60.0  # a peaked row: its other log-probabilities are about -90
    log_probs, ids = top_log_probs(tf.constant(logits), count)
    expected, expected_ids = tf.math.top_k(tf.nn.log_softmax(logits), min(count, vocab))
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(log_probs, expected, rtol=1e-6, atol=2e-6)


@pytest.mark.parametrize("cuts", [[32], [64], [32, 96], [96]])
@pytest.mark.parametrize("count", [1, 8, 40])
def test_top_log_probs_of_slices_equal_numpy(cuts, count):
    # The logits in slices along V (a sliced output layer's products), the last one not a
    # whole number of chunks: the same tokens, ties to the lower id also across a cut, and
    # log-probabilities against float64 numpy.
    rng = np.random.default_rng(len(cuts) + count)
    logits = (rng.normal(size=(5, 101)) * 4).astype(np.float32)
    logits[0, [3, cuts[0] + 1]] = 12.0  # a tie across the first cut
    logits[1] = 0.0  # ties only
    logits[2, :] = -30.0
    logits[2, -1] = 60.0  # peaked in the last slice
    logits[3, :cuts[0]] = -80.0  # one slice far below the others
    shifted = logits.astype(np.float64) - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    expected_ids = np.argsort(-log_probs, axis=-1, kind="stable")[:, :count]
    values, ids = top_log_probs([tf.constant(p) for p in np.split(logits, cuts, axis=1)], count)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(values, np.take_along_axis(log_probs, expected_ids, -1),
                               rtol=1e-6, atol=2e-6)


@pytest.mark.parametrize("plain", [False, True])
@pytest.mark.parametrize("cuts", [[], [32, 96]])
def test_top_log_probs_leave_banned_tokens_out_of_the_choice_only(cuts, plain):
    # Against float64 numpy: each row's best allowed tokens, with the log-probabilities of
    # the whole distribution; a row with fewer allowed tokens than asked for ends in -inf; a
    # banned token far above the rest (beyond PLAIN_EXP_RANGE) still counts in the normaliser.
    rng = np.random.default_rng(7)
    logits = (rng.normal(size=(4, 101)) * 4).astype(np.float32)
    logits[1, 100] = 150.0
    banned = np.full([4, 101], -1, np.int32)
    banned[0, :3] = np.argsort(-logits[0])[[0, 2, 2]]  # the best and the third (twice)
    banned[1, 0] = 100  # the peak, in the last slice
    banned[2, :6] = [0, 31, 32, 95, 96, 100]  # at the cuts
    allowed = [5, 40, 99]
    banned[3, :98] = [t for t in range(101) if t not in allowed]
    shifted = logits.astype(np.float64) - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    for row, tokens in enumerate(banned):
        log_probs[row, tokens[tokens >= 0]] = -np.inf
    expected_ids = np.argsort(-log_probs, axis=-1, kind="stable")[:, :8]
    with fast_ops.plain_ops() if plain else contextlib.nullcontext():
        values, ids = top_log_probs([tf.constant(p) for p in np.split(logits, cuts, axis=1)],
                                    8, banned=tf.constant(banned))
    np.testing.assert_array_equal(ids.numpy()[:, :3], expected_ids[:, :3])
    np.testing.assert_array_equal(ids.numpy()[:3], expected_ids[:3])
    assert sorted(ids.numpy()[3, :3]) == allowed and np.all(values[3, 3:] == -np.inf)
    np.testing.assert_allclose(values, np.take_along_axis(log_probs, expected_ids, -1),
                               rtol=1e-6, atol=2e-6)


def test_top_log_probs_of_slices_take_any_chunk_width_that_divides_them():
    # Chunks are numbered across slices: a narrower width that divides every slice but the
    # last gives numpy's tokens; a slice that would hold a partial chunk is refused (its
    # ids would be wrong, and a GPU's gather returns zeros for ids out of range).
    logits = (np.random.default_rng(3).normal(size=(4, 101)) * 4).astype(np.float32)
    expected_ids = np.argsort(-logits, axis=-1, kind="stable")[:, :8]
    parts = [tf.constant(p) for p in np.split(logits, [32, 96], axis=1)]
    _, ids = top_log_probs(parts, 8, width=16)
    np.testing.assert_array_equal(ids, expected_ids)
    with pytest.raises(ValueError, match="whole number of 64-token chunks"):
        top_log_probs(parts, 8, width=64)


@pytest.mark.parametrize("cuts", [[], [64]])
def test_top_log_probs_of_rows_beyond_the_plain_exp_range_equal_numpy(cuts):
    # Rows whose best logit lies beyond ±PLAIN_EXP_RANGE (exp would overflow, or underflow
    # the whole row) take the shifted sum, in a graph too; the rows within it give the same
    # values whatever rows share their batch.
    rng = np.random.default_rng(len(cuts))
    logits = (rng.normal(size=(5, 101)) * 4).astype(np.float32)
    logits[1] += 200.0  # exp overflows
    logits[2] -= 300.0  # exp underflows to 0 everywhere
    logits[3, :] = -30.0
    logits[3, -1] = PLAIN_EXP_RANGE - 1.0  # just inside: summed as it is
    shifted = logits.astype(np.float64) - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    expected_ids = np.argsort(-log_probs, axis=-1, kind="stable")[:, :8]
    expected = np.take_along_axis(log_probs, expected_ids, -1)

    def slices(rows):
        return [tf.constant(part) for part in np.split(rows, cuts, axis=1)]

    def search(parts):
        return top_log_probs(list(parts), 8)

    for run in (search, tf.function(search)):
        values, ids = run(slices(logits))
        np.testing.assert_array_equal(ids, expected_ids)
        np.testing.assert_allclose(values, expected, rtol=1e-6, atol=5e-6)
    inside = [0, 3, 4]
    alone, _ = search(slices(logits[inside]))
    np.testing.assert_array_equal(search(slices(logits))[0].numpy()[inside], alone)


@pytest.mark.parametrize("tie_output", [True, False])
def test_searches_with_a_sliced_output_layer_give_what_one_product_gives(monkeypatch,
                                                                        tie_output):
    # The output layer (the tied embedding transposed, or its own kernel) in two column
    # blocks (`Transformer.decoding_products`, as for a vocabulary of SLICED_VOCAB tokens or
    # more): per step two products in the loop, and the beam and greedy searches give the
    # one-product searches' ids and scores, the beam's scores those of full recomputation.
    keras.utils.set_random_seed(5)
    model = Transformer(vocab_size=64, tie_output=tie_output,
                        **get_preset("tiny", dropout=0.0))
    model.build()
    source = tf.constant(random_ids(np.random.default_rng(1), 3, 7, 64))
    whole = beam_search(model, source, beam_size=3, alpha=0.6, max_length=12, n_best=3)
    whole_greedy = greedy_decode(model, source, max_length=12)
    monkeypatch.setattr(transformer, "SLICED_VOCAB", 64)
    with model.decoding_products() as slices:
        assert slices == transformer.VOCAB_SLICES == 2
    search = tf.function(lambda s: beam_search(model, s, beam_size=3, alpha=0.6, max_length=12,
                                               n_best=3))
    ids, scores = search(source)
    np.testing.assert_array_equal(ids, whole[0])
    np.testing.assert_allclose(scores, whole[1], rtol=1e-5, atol=1e-6)
    for b in range(3):
        for n in range(3):
            log_prob, length = teacher_forced_log_prob(model, source[b], ids[b, n].numpy())
            expected = log_prob / float(length_penalty(length, 0.6))
            assert float(scores[b, n]) == pytest.approx(expected, rel=1e-4, abs=1e-4)
    greedy = greedy_decode(model, source, max_length=12)
    np.testing.assert_array_equal(greedy[0], whole_greedy[0])
    np.testing.assert_allclose(greedy[1], whole_greedy[1], rtol=1e-5, atol=1e-6)
    kinds = search_loop_ops(search, source)
    assert kinds.count("MatMul") == 6 * len(model.decoder_layers) + 2
    assert "Transpose" not in kinds


def test_top_log_probs_break_ties_like_top_k_on_bfloat16_logits():
    # A bf16 model's logits tie often. The lower id must win wherever the tied tokens lie (a
    # first version that grouped every C-th token together picked the wrong one of two
    # tied tokens in different groups).
    rng = np.random.default_rng(0)
    for _ in range(5):
        logits = tf.cast(tf.cast(rng.normal(size=(64, 8000)) * 3, tf.bfloat16), tf.float32)
        for count in (1, 8):
            _, ids = top_log_probs(logits, count)
            np.testing.assert_array_equal(ids, tf.math.top_k(logits, count).indices)


def test_long_searches_score_what_full_recomputation_scores():
    # 30 steps: past the stores' first capacity (kv_cache.INITIAL_CAPACITY), with a vocabulary
    # where EOS is rare, so that most hypotheses run to the end.
    keras.utils.set_random_seed(5)
    model = Transformer(vocab_size=64, **get_preset("tiny", dropout=0.0))
    model.build()
    source = tf.constant(random_ids(np.random.default_rng(1), 2, 7, 64))
    ids, scores = beam_search(model, source, beam_size=3, alpha=0.6, max_length=30, n_best=3)
    assert ids.shape[2] == 30
    for b in range(2):
        for n in range(3):
            log_prob, length = teacher_forced_log_prob(model, source[b], ids[b, n].numpy())
            expected = log_prob / float(length_penalty(length, 0.6))
            assert float(scores[b, n]) == pytest.approx(expected, rel=1e-4, abs=1e-4)
    greedy, _ = greedy_decode(model, source, max_length=30)
    np.testing.assert_array_equal(greedy, greedy_decode_uncached(model, source, 30))


def test_concurrent_calls_keep_their_own_stores(model):
    # The stores are written in place: each call must allocate its own, even when the graph
    # has static shapes and calls run at the same time (as under a server).
    search = tf.function(lambda s: beam_search(model, s, beam_size=3, max_length=20, n_best=3),
                         input_signature=[tf.TensorSpec([2, 5], tf.int32)])
    rng = np.random.default_rng(11)
    sources = [tf.constant(random_ids(rng, 2, 5, VOCAB)) for _ in range(4)]
    expected = [search(s)[0].numpy() for s in sources]

    def run(index):
        return [search(sources[index])[0].numpy() for _ in range(5)]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, range(4)))
    for index, repeats in enumerate(results):
        for ids in repeats:
            np.testing.assert_array_equal(ids, expected[index])


def test_searches_stop_at_the_table_of_learned_positions():
    # Step t embeds position t: with learned positions a search cannot go past the table,
    # whatever the default limit (source length + 50) says.
    keras.utils.set_random_seed(5)
    model = Transformer(vocab_size=30, **dict(get_preset("tiny", dropout=0.0),
                                               position="learned", max_length=12))
    model.build()
    never_eos = NoEos(model)
    source = tf.constant(random_ids(np.random.default_rng(2), 2, 10, 30))
    greedy, _ = greedy_decode(never_eos, source)
    beam, _ = beam_search(never_eos, source, beam_size=2)
    assert greedy.shape == (2, 12) and beam.shape == (2, 1, 12)
    assert EOS_ID not in greedy.numpy() and EOS_ID not in beam.numpy()


def test_each_sentence_of_a_batch_stops_at_its_own_source_length_plus_extra():
    # Paper §6.1's limit, per sentence: its source's subwords, EOS included, + EXTRA_LENGTH,
    # whatever the other sentences of its batch (an empty line is EOS alone).
    keras.utils.set_random_seed(5)
    model = Transformer(vocab_size=30, **get_preset("tiny", dropout=0.0))
    model.build()
    source = tf.constant([[5, 6, EOS_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID],
                          [5, 6, 7, 8, 9, 10, EOS_ID],
                          [EOS_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID]])
    limits = [3 + EXTRA_LENGTH, 7 + EXTRA_LENGTH, 1 + EXTRA_LENGTH]
    greedy, _ = greedy_decode(NoEos(model), source)
    beam, _ = beam_search(NoEos(model), source, beam_size=2)
    assert greedy.shape == (3, max(limits)) and beam.shape == (3, 1, max(limits))
    assert np.sum(greedy.numpy() != PAD_ID, axis=1).tolist() == limits
    assert np.sum(beam.numpy()[:, 0] != PAD_ID, axis=1).tolist() == limits


class NoEos(WrappedModel):
    """The model with EOS (and PAD) forbidden: every search runs to its length limit, with a
    token at every position."""

    def decode_step(self, token_ids, step, cache, source_padding, return_attention=False):
        logits, cache = self.model.decode_step(token_ids, step, cache, source_padding)
        forbidden = tf.one_hot([EOS_ID, PAD_ID], tf.shape(logits)[1])  # [2, V]
        return logits - 1e4 * tf.reduce_sum(forbidden, axis=0), cache


@pytest.mark.parametrize("stop", STOP_RULES)
def test_one_search_under_a_grid_of_alphas_gives_each_alphas_plain_search(model, stop):
    # The end of a run chooses alpha on dev from one search (`AlphaGridBeamSearch`): under
    # each alpha, the single-alpha search's hypotheses and scores (which the test above checks
    # against the float64 plain search at alpha 0 and 0.6), and under the largest, the plain
    # search's itself.
    model = EosLikely(model)
    source = random_ids(np.random.default_rng(4), 8, 5, VOCAB)
    source[::3, 2:] = PAD_ID
    source = tf.constant(source)
    alphas = [0.0, 1.5, 4.0]
    ids, scores = beam_search_alphas(model, source, alphas, beam_size=3, max_length=9,
                                     n_best=3, stop=stop)
    assert ids.shape[:3] == (8, 3, 3) and scores.shape == (8, 3, 3)
    for b in range(8):
        expected, _ = reference_beam_search(model, source[b], 3, alphas[-1], 9, stop)
        assert_plain_search_results(ids[b, -1], scores[b, -1], expected, (stop, b))
    for m, alpha in enumerate(alphas):
        single_ids, single_scores = beam_search(model, source, beam_size=3, alpha=alpha,
                                                max_length=9, n_best=3, stop=stop)
        width = single_ids.shape[2]
        np.testing.assert_array_equal(ids[:, m, :, :width], single_ids)
        assert np.all(ids.numpy()[:, m, :, width:] == PAD_ID)
        # Under "bound" a sentence may go on longer, beside other rows: its products' sums
        # may round differently.
        np.testing.assert_allclose(scores[:, m], single_scores, rtol=1e-6, atol=1e-6)
    # The alphas choose differently: the best hypothesis of some sentence changes.
    best = ids.numpy()[:, :, 0]
    assert any(not np.array_equal(best[b, 0], best[b, -1]) for b in range(8))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_search_without_repeated_ngrams_gives_what_a_plain_search_without_them_gives(model, n):
    # Untrained, the model repeats itself ("1 1 1 ..."); with two symbols besides the
    # specials, rows run out of allowed tokens (n = 1: each token once). Both stop rules, the
    # fast and the stock top-k ops; the scores stay the model's log-probabilities.
    source = random_ids(np.random.default_rng(4), 8, 5, VOCAB)
    source[::3, 2:] = PAD_ID
    source = tf.constant(source)
    for stop in STOP_RULES:
        expected = [reference_beam_search(model, source[b], 3, 0.6, 9, stop, no_repeat=n)[0]
                    for b in range(8)]
        for plain in (False, True):
            with fast_ops.plain_ops() if plain else contextlib.nullcontext():
                ids, scores = beam_search(model, source, beam_size=3, alpha=0.6, max_length=9,
                                          n_best=3, stop=stop, no_repeat_ngram_size=n)
            for b in range(8):
                assert_plain_search_results(ids[b], scores[b], expected[b], (stop, plain, b))
    repeated = [reference_beam_search(model, source[b], 3, 0.6, 9, "finished")[0][0][0]
                for b in range(4)]
    assert sum(repeats_an_ngram(tokens, n) for tokens in repeated) >= 2


def test_a_grid_of_alphas_without_repeated_ngrams_gives_each_alphas_search(model):
    model = EosLikely(model)
    source = tf.constant(random_ids(np.random.default_rng(5), 6, 5, VOCAB))
    ids, scores = beam_search_alphas(model, source, [0.0, 2.0], beam_size=3, max_length=9,
                                     no_repeat_ngram_size=2)
    for m, alpha in enumerate([0.0, 2.0]):
        for b in range(6):
            expected, _ = reference_beam_search(model, source[b], 3, alpha, 9, "finished",
                                                no_repeat=2)
            assert_plain_search_results(ids[b, m], scores[b, m], expected[:1], (alpha, b))


def test_a_negative_ngram_size_is_refused(model, source):
    with pytest.raises(ValueError, match="no_repeat_ngram_size must be >= 0"):
        beam_search(model, source, no_repeat_ngram_size=-1)
