"""export.py --format=ctranslate2: CTranslate2 (an independent C++ implementation) must compute the
model's own log-probabilities and find its greedy and beam translations; translate.py and
evaluate.py run the converted model (`ctranslate2_translator`)."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from helpers import output_log_probs, python
from tfnmt import checkpoints
from tfnmt.data.special_tokens import EOS_ID, PAD_ID
from tfnmt.inference.beam_search import beam_search
from tfnmt.inference.ctranslate2_export import (CTranslate2ExportError, export_ctranslate2,
                                                spm_pieces, transformer_spec)
from tfnmt.inference.greedy_search import greedy_decode
from tfnmt.model.transformer import Transformer

ctranslate2 = pytest.importorskip("ctranslate2")
sentencepiece = pytest.importorskip("sentencepiece")

SOURCES = ["Und Jesus sprach zu ihnen.", "Das Haus ist klein.", "Gott",
           "Guten Morgen, wie geht es?"]
MAX_LENGTH = 12
EOS_SCALE = 2.0


@pytest.fixture(scope="module")
def cli_export(tiny_model_dir, tmp_path_factory):
    """The tiny post-norm model of tiny_model_dir, converted by the export command into its
    default directory, <model_dir>/ctranslate2 (of a model_dir that links to tiny_model_dir's
    files and holds a file named `export`, where a SavedModel export would go: not in the way)."""
    model_dir = tmp_path_factory.mktemp("ct2")
    for name in os.listdir(tiny_model_dir):
        if name != "export" and not name.startswith("ctranslate2"):
            os.symlink(os.path.join(tiny_model_dir, name), model_dir / name)
    (model_dir / "export").write_text("not a directory")
    result = python("export.py", f"--model_dir={model_dir}", "--format=ctranslate2")
    assert result.returncode == 0, result.stderr[-3000:]
    out = str(model_dir / "ctranslate2")
    model, vocab, _ = checkpoints.load_model(tiny_model_dir)
    return model, vocab.source, out


@pytest.fixture(scope="module")
def prenorm_export(tiny_model_dir, tmp_path_factory):
    """Every other option CTranslate2 can express: pre-norm, GELU, learned positions, source and
    target embeddings apart, an untied output layer, 2 encoder and 1 decoder layers."""
    proto = checkpoints.load_model(tiny_model_dir)[1].source
    tf.keras.utils.set_random_seed(11)
    model = Transformer(vocab_size=600, num_encoder_layers=2, num_decoder_layers=1, d_model=32,
                        num_heads=2, d_ff=48, dropout=0.0, activation="gelu", norm_first=True,
                        position="learned", max_length=64, share_embeddings=False,
                        tie_output=False)
    model.build()
    # Keras initialises biases and LayerNorm at 0/1; perturb them so a weight set in the wrong
    # place, or not at all, changes the scores.
    rng = np.random.default_rng(0)
    for variable in model.weights:
        if len(variable.shape) == 1:
            variable.assign(variable.numpy() + rng.normal(0, 0.1, variable.shape))
    # A louder EOS column, so that hypotheses end at different lengths within MAX_LENGTH and
    # both searches have finished hypotheses to rank.
    kernel = model.output_projection.kernel
    kernel.assign(tf.tensor_scatter_nd_update(kernel, [[i, EOS_ID] for i in range(32)],
                                              kernel[:, EOS_ID] * EOS_SCALE))
    out = str(tmp_path_factory.mktemp("ct2_prenorm") / "model")
    export_ctranslate2(model, proto, out)
    return model, proto, out


def piece_batches(proto):
    processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
    pieces = [processor.encode(s, out_type=str) for s in SOURCES]
    width = max(len(p) for p in pieces) + 1
    source_ids = np.full([len(pieces), width], PAD_ID, np.int32)
    for row, sentence in enumerate(pieces):
        ids = [processor.piece_to_id(p) for p in sentence] + [EOS_ID]
        source_ids[row, :len(ids)] = ids
    return processor, pieces, source_ids


@pytest.mark.parametrize("which", ["cli_export", "prenorm_export"])
def test_ctranslate2_scores_what_the_model_computes(which, request):
    model, proto, path = request.getfixturevalue(which)
    processor, pieces, source_ids = piece_batches(proto)
    assert sorted(os.listdir(path)) == ["config.json", "model.bin", "shared_vocabulary.json",
                                        "spm.model", "tfnmt.json"]
    assert json.load(open(os.path.join(path, "tfnmt.json"))) == {"max_length": model.max_length}
    translator = ctranslate2.Translator(path, device="cpu", compute_type="float32")
    rng = np.random.default_rng(1)
    targets = [list(rng.integers(4, 600, size=n)) for n in (5, 1, 9, 3)]
    scored = translator.score_batch(pieces, [[processor.id_to_piece(int(i)) for i in t]
                                             for t in targets])
    for row, (target, result) in enumerate(zip(targets, scored)):
        expected = output_log_probs(model, source_ids[row:row + 1], list(target) + [EOS_ID])
        np.testing.assert_allclose(result.log_probs, expected, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("which", ["cli_export", "prenorm_export"])
def test_ctranslate2_greedy_and_beam_find_the_models_translations(which, request):
    model, proto, path = request.getfixturevalue(which)
    processor, pieces, source_ids = piece_batches(proto)
    translator = ctranslate2.Translator(path, device="cpu", compute_type="float32")

    def ours(ids):
        ids = ids.numpy() if hasattr(ids, "numpy") else ids
        return [[processor.id_to_piece(int(i)) for i in row if i not in (PAD_ID, EOS_ID)]
                for row in ids]

    # Without a length penalty both searches rank hypotheses by log-probability alone, and
    # CTranslate2's default of at least one token before EOS is lifted to match tfnmt. (Beams
    # can still differ in general: CTranslate2 keeps the best k extensions per step, tfnmt the
    # best 2k, so tfnmt may keep a finished hypothesis CTranslate2 drops; not on these inputs.)
    options = dict(max_decoding_length=MAX_LENGTH, min_decoding_length=0, length_penalty=0.0,
                   return_scores=True)
    greedy_ids, _ = greedy_decode(model, source_ids, max_length=MAX_LENGTH)
    greedy = translator.translate_batch(pieces, beam_size=1, **options)
    assert [r.hypotheses[0] for r in greedy] == ours(greedy_ids)
    assert sum(len(r.hypotheses[0]) for r in greedy) >= len(SOURCES)  # not all empty
    beam_ids, beam_scores = beam_search(model, source_ids, beam_size=4, alpha=0.0,
                                        max_length=MAX_LENGTH)
    beam = translator.translate_batch(pieces, beam_size=4, **options)
    assert [r.hypotheses[0] for r in beam] == ours(beam_ids[:, 0])
    np.testing.assert_allclose([r.scores[0] for r in beam], beam_scores.numpy()[:, 0], atol=1e-3)


@pytest.mark.parametrize("which", ["cli_export", "prenorm_export"])
def test_ctranslate2_greedy_without_repeated_ngrams_finds_the_models_translations(which,
                                                                                 request):
    # no_repeat_ngram_size: CTranslate2 leaves the banned tokens out and renormalises the
    # rest, tfnmt leaves them out of the choice only (its scores stay the model's
    # log-probabilities), so their beams rank by other scores; the greedy choice is the same.
    model, proto, path = request.getfixturevalue(which)
    processor, pieces, source_ids = piece_batches(proto)
    translator = ctranslate2.Translator(path, device="cpu", compute_type="float32")
    ids = {}
    for n in (0, 2):  # a beam of one is greedy (test_beam_search)
        ids[n] = beam_search(model, source_ids, beam_size=1, alpha=0.0, max_length=MAX_LENGTH,
                             no_repeat_ngram_size=n)[0][:, 0].numpy()
        greedy = translator.translate_batch(pieces, beam_size=1, max_decoding_length=MAX_LENGTH,
                                            min_decoding_length=0, no_repeat_ngram_size=n)
        assert [r.hypotheses[0] for r in greedy] == [
            [processor.id_to_piece(int(i)) for i in row if i not in (PAD_ID, EOS_ID)]
            for row in ids[n]]
    assert not np.array_equal(ids[0], ids[2])  # the untrained model repeats bigrams


def test_a_kept_no_repeat_rule_is_the_ctranslate2_models_default(prenorm_export, tmp_path):
    # export.py passes the model_dir's rule (train.py --no_repeat_ngram_size, decoding.json):
    # tfnmt.json keeps it as translate.py's and evaluate.py's default for the model.
    from tfnmt.inference import ctranslate2_translator

    model, proto, _ = prenorm_export
    out = str(tmp_path / "ruled")
    export_ctranslate2(model, proto, out, check=False, no_repeat_ngram_size=2)
    assert json.load(open(os.path.join(out, "tfnmt.json"))) == {
        "max_length": model.max_length, "no_repeat_ngram_size": 2}
    translated = {}
    for n in (None, 0, 2):
        signatures = ctranslate2_translator.load_signatures(out, no_repeat_ngram_size=n)
        translated[n] = list(signatures["serving_default"](SOURCES)[0])
    assert translated[None] == translated[2] != translated[0]
    for bad in (-1, 2.5, "2", True):
        with open(os.path.join(out, "tfnmt.json"), "w") as f:
            json.dump({"max_length": model.max_length, "no_repeat_ngram_size": bad}, f)
        with pytest.raises(ctranslate2_translator.CTranslate2ModelError, match="tfnmt.json"):
            ctranslate2_translator.load_signatures(out)


def test_the_export_chooses_its_length_penalty_on_dev_pairs(prenorm_export, small_corpus,
                                                            tmp_path):
    # Dev references that CTranslate2 itself gives at length_penalty 1.6: the export climbs
    # from 1 to a penalty under which the model translates them, keeps it and the scores it
    # compared (each sacreBLEU of CTranslate2's own translations under that penalty), and
    # translate.py's loader searches with it by default. A given penalty is kept as given.
    import sacrebleu

    from tfnmt.inference import ctranslate2_translator

    model, proto, path = prenorm_export
    processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
    with open(small_corpus["dev"], encoding="utf-8") as f:
        sources = [line.split("\t")[0] for _, line in zip(range(40), f)]
    translator = ctranslate2.Translator(path, device="cpu", compute_type="float32")

    def translated(penalty):  # CTranslate2 called directly, beam 4 as translate.py's default
        results = translator.translate_batch(
            [processor.encode(s, out_type=str) for s in sources], beam_size=4,
            length_penalty=penalty, min_decoding_length=0, max_input_length=model.max_length,
            max_decoding_length=model.max_length)
        return [processor.decode(result.hypotheses[0]) for result in results]

    references = translated(1.6)
    out = export_ctranslate2(model, proto, str(tmp_path / "chosen"),
                             dev_pairs=(sources, references, "13a"))
    kept = json.load(open(os.path.join(out, "tfnmt.json")))
    assert kept["length_penalty_chosen_on"] == "dev"
    dev_bleu = {float(a): b for a, b in kept["dev_bleu"].items()}
    assert {1.0, 1.3} <= set(dev_bleu) and dev_bleu[1.0] < 99  # the penalty matters here
    for penalty, bleu in dev_bleu.items():
        expected = sacrebleu.corpus_bleu(translated(penalty), [references]).score
        assert bleu == pytest.approx(expected, abs=0.006)
    assert translated(kept["length_penalty"]) == references
    signatures = ctranslate2_translator.load_signatures(out)
    assert list(signatures["serving_default"](sources)[0]) == [t.encode() for t in references]

    given = export_ctranslate2(model, proto, str(tmp_path / "given"), check=False,
                               length_penalty=0.4, dev_pairs=(sources, references, "13a"))
    assert json.load(open(os.path.join(given, "tfnmt.json"))) == {
        "max_length": model.max_length, "length_penalty": 0.4,
        "length_penalty_chosen_on": "--alpha"}
    signatures = ctranslate2_translator.load_signatures(given)
    assert list(signatures["serving_default"](sources)[0]) == [
        t.encode() for t in translated(0.4)]
    for bad in (-1, "1", True, None, 1e400):
        with open(os.path.join(given, "tfnmt.json"), "w") as f:
            json.dump({"max_length": model.max_length, "length_penalty": bad}, f)
        with pytest.raises(ctranslate2_translator.CTranslate2ModelError, match="tfnmt.json"):
            ctranslate2_translator.load_signatures(given)


@pytest.mark.parametrize("count,kept", [(0, 0), (1, 1), (999, 999), (1000, 1000), (1001, 501),
                                        (2000, 1000), (2001, 667), (3003, 751)])
def test_the_choice_translates_at_most_1000_dev_pairs_spread_through_the_split(count, kept):
    # Every k-th pair from the first, for the smallest k that keeps no more than 1,000.
    from tfnmt.inference.ctranslate2_translator import choice_pairs

    pairs = [(f"s{i}", f"t{i}") for i in range(count)]
    stride = next(k for k in range(1, count + 2) if len(range(0, count, k)) <= 1000)
    assert choice_pairs(pairs) == pairs[::stride] and len(pairs[::stride]) == kept


def test_export_py_chooses_the_length_penalty_on_the_model_dirs_dev_split(tiny_model_dir,
                                                                          small_corpus,
                                                                          tmp_path):
    # The dev split the model_dir's settings name (here 12 pairs of a TSV), scored with
    # the run's sacreBLEU tokenization; --alpha instead keeps the penalty given, reading no
    # dev split.
    import sacrebleu

    model_dir = tmp_path / "run"
    model_dir.mkdir()
    for name in ("spm.model", "checkpoints"):
        os.symlink(os.path.join(tiny_model_dir, name), model_dir / name)
    with open(small_corpus["dev"], encoding="utf-8") as f:
        (tmp_path / "dev.tsv").write_text("".join(line for _, line in zip(range(12), f)),
                                          encoding="utf-8")
    settings = json.load(open(os.path.join(tiny_model_dir, "settings.json")))
    settings.update(data={"dataset": "files", "files": {"dev": str(tmp_path / "dev.tsv")}},
                    train={"bleu_tokenize": "char"})
    (model_dir / "settings.json").write_text(json.dumps(settings))
    chosen = python("export.py", f"--model_dir={model_dir}", "--format=ctranslate2")
    assert chosen.returncode == 0, chosen.stderr[-3000:]
    kept = json.load(open(model_dir / "ctranslate2" / "tfnmt.json"))
    assert kept["length_penalty_chosen_on"] == "dev" and "1" in kept["dev_bleu"]
    pairs = [line.split("\t")[:2] for line in open(tmp_path / "dev.tsv", encoding="utf-8")]
    processor = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / "spm.model"))
    results = ctranslate2.Translator(str(model_dir / "ctranslate2")).translate_batch(
        [processor.encode(s, out_type=str) for s, _ in pairs], beam_size=4, length_penalty=1.0,
        min_decoding_length=0, max_input_length=64, max_decoding_length=64)
    hypotheses = [processor.decode(result.hypotheses[0]) for result in results]
    references = [[t for _, t in pairs]]
    bleu = {tokenize: sacrebleu.corpus_bleu(hypotheses, references, tokenize=tokenize).score
            for tokenize in ("char", "13a")}
    assert kept["dev_bleu"]["1"] == pytest.approx(bleu["char"], abs=0.006)
    assert abs(bleu["char"] - bleu["13a"]) > 0.05  # the run's tokenization, not 13a
    lines = chosen.stdout.splitlines()
    assert "choosing the length penalty on the dev split (12 sentences)" in lines
    assert f"length penalty {kept['length_penalty']:g}, chosen on dev (sacreBLEU " + ", ".join(
        f"{a} {b:.2f}" for a, b in kept["dev_bleu"].items()) + ")" in lines
    given = python("export.py", f"--model_dir={model_dir}", "--format=ctranslate2",
                   "--alpha=0.5", f"--export_dir={tmp_path / 'given'}")
    assert given.returncode == 0, given.stderr[-3000:]
    assert "choosing" not in given.stdout and "length_penalty=0.5" in given.stdout
    assert json.load(open(tmp_path / "given" / "tfnmt.json"))["length_penalty"] == 0.5


def test_ctranslate2_translates_long_sources_within_the_models_positions(prenorm_export):
    # The model has positions 0..max_length-1 (64 learned rows here). CTranslate2's defaults
    # (inputs up to 1,024 tokens) fail on a longer source; with max_input_length=max_length it
    # keeps max_length - 1 pieces and EOS, as the SavedModel truncates, and finds the model's
    # greedy translation of them. max_decoding_length=max_length stays within the positions.
    model, proto, path = prenorm_export
    processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
    pieces = processor.encode(" ".join(SOURCES * 8), out_type=str)
    assert len(pieces) > model.max_length
    translator = ctranslate2.Translator(path, device="cpu", compute_type="float32")
    with pytest.raises(RuntimeError, match="No position encodings are defined for positions"):
        translator.translate_batch([pieces], beam_size=1)
    kept = [processor.piece_to_id(p) for p in pieces[:model.max_length - 1]] + [EOS_ID]
    greedy_ids, _ = greedy_decode(model, np.array([kept], np.int32), max_length=model.max_length)
    result = translator.translate_batch([pieces], beam_size=1, min_decoding_length=0,
                                        max_input_length=model.max_length,
                                        max_decoding_length=model.max_length)
    assert result[0].hypotheses[0] == [processor.id_to_piece(int(i)) for i in
                                       greedy_ids.numpy()[0] if i not in (PAD_ID, EOS_ID)]


def test_quantized_export_and_refusals(cli_export, tmp_path):
    model, proto, _ = cli_export
    out = export_ctranslate2(model, proto, str(tmp_path / "int8"), quantization="int8")
    assert os.path.getsize(os.path.join(out, "model.bin")) < os.path.getsize(
        os.path.join(cli_export[2], "model.bin")) / 2
    with pytest.raises(FileExistsError):
        export_ctranslate2(model, proto, out)
    with pytest.raises(ValueError, match="quantization"):
        export_ctranslate2(model, proto, str(tmp_path / "x"), quantization="int4")
    with pytest.raises(CTranslate2ExportError, match="vocabulary of 600 ids"):
        transformer_spec(model, spm_pieces(proto)[:500], spm_pieces(proto))
    assert sorted(os.listdir(tmp_path)) == ["int8"]  # failures leave nothing behind


def test_an_export_written_meanwhile_by_another_is_kept(cli_export, tmp_path, monkeypatch):
    # Two exports to one directory at once: the second to finish is refused in one line (it
    # said "Directory not empty"), the first's files kept, nothing left behind.
    from tfnmt.inference import ctranslate2_export

    model, proto, _ = cli_export
    other = tmp_path / "ct2"

    def another_export_finishes_first(model_dir, source_proto):
        other.mkdir()
        (other / "model.bin").write_text("the other export's")

    monkeypatch.setattr(ctranslate2_export, "_check", another_export_finishes_first)
    with pytest.raises(FileExistsError, match="ct2 was written by another export while this "
                                              "one was; give another --export_dir"):
        export_ctranslate2(model, proto, str(other))
    assert os.listdir(tmp_path) == ["ct2"] and os.listdir(other) == ["model.bin"]
    assert (other / "model.bin").read_text() == "the other export's"


def test_export_command_refuses_saved_model_options_for_ctranslate2(tiny_model_dir, tmp_path):
    result = python("export.py", f"--model_dir={tiny_model_dir}", "--format=ctranslate2",
                    "--beam_size=5", f"--export_dir={tmp_path / 'x'}")
    assert result.returncode == 1
    assert result.stderr.strip() == ("export.py: --beam_size is for SavedModel exports; "
                                     "CTranslate2 takes its decoding options when it translates")
    assert not os.path.exists(tmp_path / "x")


def model_source_ids(processor, text, max_length):
    """[1, S] ids of `text` as the SavedModel reads it: at most max_length - 1 pieces, then EOS."""
    return np.array([processor.encode(text)[:max_length - 1] + [EOS_ID]], np.int32)


def test_translate_and_evaluate_run_a_ctranslate2_model(prenorm_export, tmp_path):
    # translate.py and evaluate.py take the directory as --export, without TensorFlow: greedy
    # translations are the model's own (tfnmt's greedy search of the model in TensorFlow),
    # blank lines give "" (as the SavedModel answers them), a long line is cut as the SavedModel
    # cuts it, and said; n-best lists are CTranslate2's beam with the flags' settings; scores of
    # given translations are the model's log-probabilities; BLEU is sacreBLEU's of the output.
    import sacrebleu

    from helpers import imported_modules, python

    model, proto, path = prenorm_export
    processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
    long_line = " ".join(SOURCES * 8)
    lines = SOURCES + ["", " \u200b\t\u00ad", long_line]  # blanks, format characters
    source = tmp_path / "in.de"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    output = tmp_path / "out.en"
    greedy = python("translate.py", f"--export={path}", "--beam_size=1", f"--input={source}",
                    f"--output={output}", env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert greedy.returncode == 0, greedy.stderr[-3000:]
    assert "tensorflow" not in imported_modules(greedy.stderr)
    assert "ctranslate2" in imported_modules(greedy.stderr)
    long_pieces = len(processor.encode(long_line))
    assert (f"translate.py: line 7 ({long_pieces:,} subwords) is longer than the 63 subwords the "
            "model reads: its translation covers the first 63") in greedy.stderr
    expected = []
    for line in lines:
        if not line.strip(" \u200b\t\u00ad"):
            expected.append("")
            continue
        ids, _ = greedy_decode(model, model_source_ids(processor, line, model.max_length),
                               max_length=model.max_length)
        expected.append(processor.decode([int(i) for i in ids.numpy()[0]
                                          if i not in (PAD_ID, EOS_ID)]))
    translations = output.read_text(encoding="utf-8").split("\n")[:-1]
    assert translations == expected
    assert sum(len(t.split()) for t in translations) >= len(SOURCES)  # not all empty

    n_best = python("translate.py", f"--export={path}", "--beam_size=4", "--alpha=0.5",
                    "--n_best=3", "--no_repeat_ngram_size=2", f"--input={source}")
    assert n_best.returncode == 0, n_best.stderr[-3000:]
    translator = ctranslate2.Translator(path, device="cpu", compute_type="float32")
    results = translator.translate_batch(
        [processor.encode(s, out_type=str) for s in SOURCES], beam_size=4, length_penalty=0.5,
        num_hypotheses=3, no_repeat_ngram_size=2, return_scores=True, min_decoding_length=0,
        max_input_length=model.max_length, max_decoding_length=model.max_length)
    listed = n_best.stdout.splitlines()
    assert len(listed) == 3 * len(lines)
    for number, result in enumerate(results):
        for rank, (hypothesis, score) in enumerate(zip(result.hypotheses, result.scores)):
            got_number, text, value = listed[3 * number + rank].split(" ||| ")
            assert (int(got_number), text) == (number, processor.decode(hypothesis))
            assert float(value) == pytest.approx(score, abs=1e-5)
    assert listed[3 * len(SOURCES)] == f"{len(SOURCES)} |||  ||| 0.000000"

    rng = np.random.default_rng(3)
    targets = [processor.decode([int(i) for i in rng.integers(4, 600, size=n)])
               for n in (5, 1, 9, 3)] + ["x", "y", "z"]
    target_file = tmp_path / "targets.en"
    target_file.write_text("".join(t + "\n" for t in targets), encoding="utf-8")
    scored = python("translate.py", f"--export={path}", f"--input={source}",
                    f"--score_targets={target_file}")
    assert scored.returncode == 0, scored.stderr[-3000:]
    for line, target, row in zip(lines, targets, scored.stdout.splitlines()):
        target_ids = processor.encode(target)[:model.max_length - 1] + [EOS_ID]
        log_probs = output_log_probs(model, model_source_ids(processor, line, model.max_length),
                                     target_ids)
        value, count = row.split("\t")
        assert int(count) == len(target_ids)
        assert float(value) == pytest.approx(float(np.sum(log_probs)), abs=2e-3)

    references = tmp_path / "ref.en"
    references.write_text("".join(f"{t} {s}\n" for t, s in zip(expected, lines)),
                          encoding="utf-8")
    evaluated = python("evaluate.py", f"--export={path}", f"--source={source}",
                       f"--reference={references}", "--beam_size=1", "--json",
                       env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "tensorflow" not in imported_modules(evaluated.stderr)
    bleu = sacrebleu.corpus_bleu(expected, [[f"{t} {s}" for t, s in zip(expected, lines)]])
    assert json.loads(evaluated.stdout)["bleu"] == pytest.approx(bleu.score, abs=0.005)


def test_translate_py_draws_and_forces_prefixes_with_a_ctranslate2_model(prenorm_export,
                                                                         tmp_path):
    # Sampling: the same --seed draws the same translations, another seed others; a prefix
    # starts each translation; the flags CTranslate2 has no use for, and a CTranslate2
    # directory without tfnmt.json, are refused in one line.
    from helpers import python

    model, proto, path = prenorm_export
    source = tmp_path / "in.de"
    source.write_text("".join(s + "\n" for s in SOURCES * 4), encoding="utf-8")
    drawn = [python("translate.py", f"--export={path}", f"--input={source}",
                    "--sampling_topk=0", f"--seed={seed}", "--sampling_temperature=2")
             for seed in (5, 5, 6)]
    assert all(d.returncode == 0 for d in drawn), drawn[0].stderr[-3000:]
    assert drawn[0].stdout == drawn[1].stdout != drawn[2].stdout
    assert len(set(drawn[0].stdout.splitlines())) > len(SOURCES)  # the same line, other draws

    processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
    prefixes = ["Gott sprach", "", "Und", "zu"]
    prefix_file = tmp_path / "prefixes.en"
    prefix_file.write_text("".join(p + "\n" for p in prefixes), encoding="utf-8")
    source.write_text("".join(s + "\n" for s in SOURCES), encoding="utf-8")
    forced = python("translate.py", f"--export={path}", f"--input={source}",
                    f"--target_prefix={prefix_file}")
    assert forced.returncode == 0, forced.stderr[-3000:]
    plain = python("translate.py", f"--export={path}", f"--input={source}")
    for prefix, got, free in zip(prefixes, forced.stdout.splitlines(),
                                 plain.stdout.splitlines()):
        assert got.startswith(processor.decode(processor.encode(prefix)))
        if not prefix:
            assert got == free

    for flag in ("--beam_stop=bound", "--checkpoint=latest"):
        refused = python("translate.py", f"--export={path}", f"--input={source}", flag)
        assert refused.returncode == 1 and refused.stderr == (
            f"translate.py: --{flag[2:].split('=')[0]} applies to --model_dir; {path} is a "
            "CTranslate2 model, which searches its own way\n")
    bare = tmp_path / "converted"
    bare.mkdir()
    for name in ("model.bin", "config.json", "shared_vocabulary.json", "spm.model"):
        os.symlink(os.path.join(path, name), bare / name)
    for script in ("translate.py", "evaluate.py"):
        extra = [f"--input={source}"] if script == "translate.py" else [
            f"--source={source}", f"--reference={source}"]
        refused = python(script, f"--export={bare}", *extra)
        assert refused.returncode == 1 and refused.stderr == (
            f"{script}: {bare} is a CTranslate2 model without a readable tfnmt.json (the "
            "model's max_length, which export.py --format=ctranslate2 writes): remove it and "
            "export the model again\n")
    # Files that do not load: each named in one line.
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    os.remove(broken / "spm.model")
    (broken / "target.spm.model").write_bytes(b"")
    said = {}
    said["holds no spm.model"] = python("translate.py", f"--export={broken}", f"--input={source}")
    (broken / "spm.model").write_bytes(b"not a model")
    said["spm.model does not load as a SentencePiece model: "] = python(
        "translate.py", f"--export={broken}", f"--input={source}")
    shutil.copy(os.path.join(path, "spm.model"), broken / "spm.model")
    os.truncate(broken / "model.bin", 5000)
    said["does not load as a CTranslate2 model: "] = python(
        "translate.py", f"--export={broken}", f"--input={source}")
    for message, result in said.items():
        assert result.returncode == 1 and len(result.stderr.splitlines()) == 1, result.stderr
        assert message in result.stderr


def test_a_machine_without_ctranslate2_is_told_which_package_to_install(prenorm_export,
                                                                        monkeypatch):
    import importlib.util

    from tfnmt.inference.ctranslate2_translator import CTranslate2ModelError, check_runnable

    path = prenorm_export[2]
    check_runnable(path)
    installed = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "ctranslate2" else
                        installed(name, *args))
    with pytest.raises(CTranslate2ModelError) as error:
        check_runnable(path)
    assert str(error.value) == (f"{path} is a CTranslate2 model, and the ctranslate2 package is "
                                "not installed (pip install ctranslate2)")
