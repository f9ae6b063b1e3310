import os

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf

from helpers import imported_modules, python, train_flags
from tfnmt import checkpoints
from tfnmt.inference import search_memory
from tfnmt.inference.evaluation import Translator
from tfnmt.inference.serving import TranslationModule

GIB = 2 ** 30
SENTENCES = ["Das ist ein Haus.", "Und Gott sah, dass es gut war, und es ward Abend.", "Ja.",
             "", "Er sprach zu ihnen: Geht hin in alle Welt."]


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("where", ["python", "graph"])
def test_available_memory_is_the_least_of_the_kernel_and_the_cgroup(tmp_path, where):
    # The Python reading (a model_dir's translator) and the graph's (an export's, where it is
    # served) against the files' own numbers.
    def available(meminfo, cgroup):
        if where == "python":
            return search_memory.available_bytes(meminfo, cgroup)
        got = int(tf.function(lambda: search_memory.available_bytes_in_graph(meminfo, cgroup),
                              autograph=False)())
        return None if got == -1 else got

    meminfo = write(tmp_path / "meminfo", "MemTotal: 24000000 kB\nMemAvailable: 2000000 kB\n")
    none = str(tmp_path / "no-cgroup")
    assert available(meminfo, none) == 2000000 * 1024
    v2 = tmp_path / "v2"
    write(v2 / "memory.max", f"{1 * GIB}\n")
    write(v2 / "memory.current", f"{GIB // 4}\n")
    assert available(meminfo, str(v2)) == GIB - GIB // 4
    assert available(none, str(v2)) == GIB - GIB // 4
    write(v2 / "memory.max", "max\n")  # no limit
    assert available(meminfo, str(v2)) == 2000000 * 1024
    v1 = tmp_path / "v1"
    write(v1 / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")  # v1's no limit
    write(v1 / "memory" / "memory.usage_in_bytes", "5000\n")
    assert available(meminfo, str(v1)) == 2000000 * 1024
    write(v1 / "memory" / "memory.limit_in_bytes", f"{GIB // 2}\n")
    assert available(meminfo, str(v1)) == GIB // 2 - 5000
    # Used up beyond its limit: nothing left, not a negative amount.
    write(v1 / "memory" / "memory.usage_in_bytes", f"{GIB}\n")
    assert available(meminfo, str(v1)) == 0
    # A limit without its usage, or unreadable, counts for nothing.
    write(v1 / "memory" / "memory.usage_in_bytes", "a lot\n")
    assert available(meminfo, str(v1)) == 2000000 * 1024
    os.remove(v1 / "memory" / "memory.usage_in_bytes")
    assert available(meminfo, str(v1)) == 2000000 * 1024
    assert available(write(tmp_path / "other", "MemTotal: 24000000 kB\n"), none) is None
    assert available(none, none) is None
    assert search_memory.memory_budget(available=GIB) == GIB // 2


def test_the_estimate_grows_with_the_beam_the_vocabulary_and_the_output():
    base = {"num_layers": 6, "d_model": 512, "vocab_size": 32000}
    one = search_memory.sentence_bytes(base, 200, 80)
    # Beam 200 of a base model over 32,000 subwords, an 80-subword output limit: the
    # self-attention stores (6 layers x keys and values x 200 x 512 x up to 160 positions)
    # hold most of it.
    stores = 6 * 2 * 200 * 512 * 160 * 4
    assert stores < one < 1.5 * stores
    assert search_memory.sentence_bytes(base, 400, 80) > 2 * one * 0.99
    assert search_memory.sentence_bytes(base, 200, 160) > one
    assert search_memory.sentence_bytes(dict(base, vocab_size=64000), 200, 80) > one
    # A model's own settings name the decoder's depth and the target side's vocabulary.
    separate = dict(base, num_decoder_layers=2, target_vocab_size=8000)
    assert search_memory.sentence_bytes(separate, 200, 80) < one / 2


def test_a_beam_that_does_not_fit_for_one_sentence_is_refused_with_the_widest_that_does():
    settings = {"num_layers": 2, "d_model": 64, "vocab_size": 600}
    available = 3 * GIB
    with pytest.raises(search_memory.SearchMemoryError) as refused:
        search_memory.check_beam(settings, 10 ** 9, "--beam_size", available=available)
    message = str(refused.value)
    assert message.startswith("--beam_size=1000000000: a search of 1,000,000,000 hypotheses ")
    assert "(600 target subwords, 2 decoder layers of width 64)" in message
    assert "more than the 3 GiB this machine has available" in message
    widest = int(message.rsplit("give at most ", 1)[1].replace(",", ""))
    limit = 2 + search_memory.EXTRA_LENGTH  # one subword and EOS
    assert search_memory.sentence_bytes(settings, widest, limit) <= available
    assert search_memory.sentence_bytes(settings, widest + 1, limit) > available
    search_memory.check_beam(settings, widest, available=available)  # passes
    with pytest.MonkeyPatch.context() as patch:  # a machine that does not tell: no check
        patch.setattr(search_memory, "available_bytes", lambda: None)
        search_memory.check_beam(settings, 10 ** 9)
    with pytest.raises(search_memory.SearchMemoryError):
        search_memory.check_beam(settings, widest + 1, available=available)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    model, vocab, _ = checkpoints.load_model(tiny_model_dir)
    return model, vocab


def test_a_wide_beam_searches_as_many_sentences_at_once_as_fit(tiny, tiny_model_dir,
                                                                tmp_path):
    model, vocab = tiny
    processor = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(tiny_model_dir, "spm.model"))
    longest = max(len(processor.encode(s)) for s in SENTENCES)  # subwords, without EOS
    per_sentence = search_memory.sentence_bytes(model.settings, 5,
                                                longest + 1 + search_memory.EXTRA_LENGTH)
    sentences = tf.constant(SENTENCES)
    unbounded = TranslationModule(model, vocab, beam_size=5, n_best=2, chunk_size=4)
    assert unbounded._search_chunk_size(sentences) == 4
    expected = unbounded.serve_n_best(sentences)
    assert longest + 1 + search_memory.EXTRA_LENGTH < 80  # the long prefix below is longer
    searched = {4}  # chunk sizes whose translations are compared (each search a trace)
    for budget, size in ((2 * per_sentence + per_sentence // 2, 2), (2 * per_sentence - 1, 1),
                         (per_sentence - 1, 1), (100 * per_sentence, 4)):
        bounded = TranslationModule(model, vocab, beam_size=5, n_best=2, chunk_size=4,
                                    memory_budget=budget)
        assert int(bounded._search_chunk_size(sentences)) == size
        if size not in searched:
            searched.add(size)
            got = bounded.serve_n_best(sentences)
            np.testing.assert_array_equal(got["translations"], expected["translations"])
            np.testing.assert_allclose(got["scores"], expected["scores"], rtol=1e-5, atol=1e-6)
        # A target prefix longer than a source's output limit raises it.
        prefix = " ".join(["und es geschah"] * 40)
        prefixes = tf.constant([""] * (len(SENTENCES) - 1) + [prefix])
        limit = max(longest + 1 + search_memory.EXTRA_LENGTH, len(processor.encode(prefix)) + 1)
        fit = budget // search_memory.sentence_bytes(model.settings, 5, limit)
        assert int(bounded._search_chunk_size(sentences, prefixes)) == min(max(fit, 1), 4)
    # An export's budget: half the memory available where its graph runs; none where that
    # cannot be read or the machine has a GPU (its search is in the GPU's memory).
    meminfo, gpu = tmp_path / "meminfo", tmp_path / "nvidia0"
    served = TranslationModule(model, vocab, beam_size=5, n_best=2, chunk_size=4,
                               memory_budget=search_memory.SERVING_MACHINE,
                               memory_files=(str(meminfo), str(tmp_path / "no-cgroup")),
                               gpu_files=[str(tmp_path / "nvidia*")])
    for kib, on_gpu, size in ((5 * per_sentence // 1024, False, 2),
                              (per_sentence // 1024, False, 1), (None, False, 4),
                              (per_sentence // 1024, True, 4),
                              (1000 * per_sentence // 1024, False, 4)):
        meminfo.write_text("" if kib is None else f"MemAvailable: {kib} kB\n")
        if on_gpu:
            gpu.write_text("")
        assert int(served._search_chunk_size(sentences)) == size, (kib, on_gpu)
        if on_gpu:
            gpu.unlink()
    # Sampling searches one row per sentence; an empty request gives empty outputs.
    sampling = TranslationModule(model, vocab, n_best=1, chunk_size=4, memory_budget=1,
                                 sampling={"temperature": 1.0, "top_k": 0, "seed": 1})
    assert int(sampling._search_chunk_size(sentences)) == 1
    empty = TranslationModule(model, vocab, beam_size=5, n_best=1, memory_budget=1)
    assert empty.serve(tf.constant([], tf.string))["translations"].shape == (0,)


def test_output_limits_and_chunk_size_follow_the_length_rules(tiny, tiny_model_dir):
    from tfnmt.model.transformer import Transformer

    model, vocab = tiny
    processor = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(tiny_model_dir, "spm.model"))
    sources = [len(processor.encode(s)) + 1 for s in SENTENCES]  # with EOS
    prefixes = ["", "und es geschah " * 10, "Ja", "", ""]
    forced = [len(processor.encode(p)) for p in prefixes]
    learned = Transformer(**dict(model.settings, position="learned", max_length=30))
    extra = search_memory.EXTRA_LENGTH
    for search_model, cap, table in ((model, 0, None), (model, 12, None), (learned, 0, 30),
                                     (learned, 12, 30)):
        module = TranslationModule(search_model, vocab, beam_size=3, n_best=1, chunk_size=4,
                                   max_decode_length=cap, memory_budget=10 ** 6)
        source_ids = module.source_ids(tf.constant(SENTENCES))
        prefix_ids = module._prefix_ids(tf.constant(prefixes))
        expected = []
        for length, prefix in zip(sources, forced):
            limit = min(length + extra, table or length + extra, cap or length + extra)
            limit = max(limit, prefix + 1)
            expected.append(min(limit, table) if table else limit)
        np.testing.assert_array_equal(module._output_limits(source_ids, prefix_ids), expected)
        fit = 10 ** 6 // search_memory.sentence_bytes(search_model.settings, 3, max(expected))
        assert int(module._search_chunk_size(tf.constant(SENTENCES), tf.constant(prefixes))) \
            == min(max(fit, 1), 4)


def test_training_evaluation_batches_fewer_sentences_of_a_wide_beam(tiny):
    model, _ = tiny
    vocabulary = None  # batching needs only the model
    per_sentence = search_memory.sentence_bytes(model.settings, 50,
                                                64 + search_memory.EXTRA_LENGTH)
    assert Translator(model, vocabulary, 64, beam_size=50,
                      memory_budget=3 * per_sentence).batch_size == 3
    assert Translator(model, vocabulary, 64, beam_size=50, memory_budget=1).batch_size == 1
    assert Translator(model, vocabulary, 64, beam_size=50, memory_budget=None).batch_size == 64
    # Greedy search keeps its batches.
    assert Translator(model, vocabulary, 64, memory_budget=1).batch_size == 64


def test_a_model_dir_translator_searches_within_half_the_memory_available(
        tiny_model_dir, monkeypatch):
    from tfnmt.inference import loading, serving

    built = []

    def recorded(*args, **kwargs):
        built.append(kwargs)
        return TranslationModule(*args, **kwargs)

    monkeypatch.setattr(serving, "TranslationModule", recorded)  # loading imports it when used
    monkeypatch.setattr(search_memory, "available_bytes", lambda: 8 * GIB)
    translate = loading.load_signatures(tiny_model_dir, beam_size=5)["serving_default"]
    assert built[-1]["memory_budget"] == 4 * GIB
    assert translate(["Das ist ein Haus."])[0].shape == (1,)
    monkeypatch.setattr(search_memory, "available_bytes", lambda: GIB)
    with pytest.raises(search_memory.SearchMemoryError, match="--beam_size=100000000: "):
        loading.load_signatures(tiny_model_dir, beam_size=10 ** 8)


@pytest.mark.parametrize("program", ["translate.py", "evaluate.py", "export.py"])
def test_the_programs_refuse_a_beam_no_sentence_fits_in(program, tiny_model_dir, tmp_path):
    source = write(tmp_path / "in.de", "Das ist ein Haus.\n")
    reference = write(tmp_path / "ref.en", "This is a house.\n")
    args = {"translate.py": [f"--input={source}"],
            "evaluate.py": [f"--source={source}", f"--reference={reference}"],
            "export.py": [f"--export_dir={tmp_path / 'export'}"]}[program]
    result = python(program, f"--model_dir={tiny_model_dir}", *args,
                    "--beam_size=1000000000000")
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{program}: --beam_size=1000000000000: a search of "
                           "1,000,000,000,000 hypotheses holds about "), result.stderr
    assert "GiB this machine has available: give at most " in last
    assert "Traceback" not in result.stderr
    assert not os.path.exists(tmp_path / "export")


def test_train_py_refuses_an_eval_beam_no_sentence_fits_in(small_corpus, tmp_path):
    # Before TensorFlow loads and before anything is written in the model_dir.
    model_dir = str(tmp_path / "run")
    result = python(*train_flags(small_corpus, None, model_dir, eval_beam_size=10 ** 9),
                    env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert result.returncode == 1, result.stderr
    assert "train.py: --eval_beam_size=1000000000: a search of 1,000,000,000 hypotheses " \
        "holds about " in result.stderr
    assert "(600 target subwords, 1 decoder layer of width 64)" in result.stderr
    assert not os.path.exists(model_dir) or not os.listdir(model_dir)
    assert "tensorflow" not in imported_modules(result.stderr)
