import glob
import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from helpers import (built_once, entry_point_command, python, started,
                     teacher_forced_log_prob)
from tfnmt import checkpoints
from tfnmt.inference import search_memory
from tfnmt.inference.beam_search import beam_search
from tfnmt.inference.saved_model import ExportCheckError, export_saved_model
from tfnmt.inference.serving import (GPU_DEVICE_FILES, TranslationModule, dealt_order,
                                     search_bounds)
from tfnmt.inference.session_loader import SessionModel
from tfnmt.layers.linear import slice_bounds
from tfnmt.model import transformer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Blank but not ASCII-blank: NBSP, ideographic space, zero-width space, BOM, line separator.
BLANKS = ["\u00a0", "\u3000 \u200b", "\ufeff\u2028"]
SENTENCES = ["Das ist ein Haus.", "Er sprach zu ihnen.", "", "Guten Morgen!"] + BLANKS

# tensorflow-text ops that stock TF Serving links (its ops_lib), as used by the export.
TF_TEXT_OPS = {"SentencepieceOp", "SentencepieceTokenizeOp", "SentencepieceDetokenizeOp",
               "SentencepieceVocabSizeOp", "SentencepieceIdToStringOp",
               "SentencepieceStringToIdOp", "SentencepieceTokenizeWithOffsetsOp"}
FORBIDDEN = {"PyFunc", "PyFuncStateless", "EagerPyFunc"}


# Where a vocabulary might have been trained; SentencePiece records it in the model.
TRAINING_PATH = "/home/trainer/private-run-7f3a/spm.model.tmp"


def with_training_path(proto):
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto.FromString(proto)
    model.trainer_spec.model_prefix = TRAINING_PATH
    model.trainer_spec.input.append(TRAINING_PATH + ".txt")
    return model.SerializeToString()


@pytest.fixture(scope="module", autouse=True)
def sliced_output_layer():
    """The tiny model's 600-token output layer in slices, as an 8,000-token one is
    (`Transformer.decoding_products`): the exports here are of what users get."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transformer, "SLICED_VOCAB", 600)
        yield


@pytest.fixture(scope="module")
def module(tiny_model_dir):
    model, vocab, _ = checkpoints.load_model(tiny_model_dir)
    assert vocab.shared
    # As export.py builds it: its searches fit in the memory of the machine that serves.
    return TranslationModule(model, with_training_path(vocab.source), beam_size=3, alpha=0.6,
                             n_best=2, memory_budget=search_memory.SERVING_MACHINE)


@pytest.fixture(scope="module")
def exported(module, tiny_model_dir, tmp_path_factory):
    """The module's export (version 1), written once for every xdist worker whose tiny model
    is the same files (its build is deterministic; the directory is keyed by the files' digest,
    so workers with different models would each write their own). Tests copy it to change it."""
    digest = hashlib.sha256()
    for name in ("settings.json", "spm.model", "checkpoints/ckpt-1.index",
                 "checkpoints/ckpt-1.data-00000-of-00001"):
        with open(os.path.join(tiny_model_dir, name), "rb") as f:
            digest.update(f.read())
    export_dir = built_once(tmp_path_factory, f"export-{digest.hexdigest()[:16]}",
                            lambda path: export_saved_model(module, path))
    return os.path.join(export_dir, "1")


def graph_nodes(export_path):
    """Every node of an export's graph and of its functions."""
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(export_path, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    for meta_graph in proto.meta_graphs:
        yield from meta_graph.graph_def.node
        for function in meta_graph.graph_def.library.function:
            yield from function.node_def


def graph_ops(export_path):
    return {node.op for node in graph_nodes(export_path)}


def graph_strings(export_path):
    """The string constants of an export's graph (the files it reads where it runs, ...)."""
    return {value.decode(errors="replace") for node in graph_nodes(export_path)
            if node.op == "Const" for value in node.attr["value"].tensor.string_val}


def decoding_copies(model, matmul_dtypes):
    """What an export keeps beside the weights for its searches in each matmul dtype, made here
    with numpy: the tied output kernel transposed (in column blocks when the model's vocabulary
    is sliced, `transformer.SLICED_VOCAB`) and each decoder layer's self-attention query, key
    and value kernels side by side (the bfloat16 ones from the weights rounded to bfloat16),
    and those biases side by side (float32, once)."""
    import ml_dtypes

    copies = []
    for layer in model.decoder_layers:
        attention = layer.self_attention
        copies.append(np.concatenate([b.numpy() for b in attention.projection_biases()]))
    for dtype in matmul_dtypes:
        def rounded(weight):
            value = weight.numpy()
            return value if dtype == "float32" else value.astype(ml_dtypes.bfloat16)

        assert model.output_projection is None  # tied: x · Eᵀ
        output = rounded(model.target_embedding.embeddings).T  # [D, V]
        vocab = output.shape[1]
        slices = transformer.VOCAB_SLICES if vocab >= transformer.SLICED_VOCAB else 1
        copies.extend(np.split(output, slice_bounds(vocab, slices)[1:-1], axis=1))
        for layer in model.decoder_layers:
            copies.append(np.concatenate([rounded(k) for k in
                                          layer.self_attention.projection_kernels()], axis=1))
    return copies


def assert_each_weight_saved_once(export_path, model, extra=(), matmul_dtypes=("float32",)):
    """The export's saved tensors are the model's weights, each once with its values, the
    copies its searches multiply by (`decoding_copies`), and the `extra` arrays (a second copy
    of a weight would only grow the files; a graph reading copies the restore does not fill
    fails every request)."""
    reader = tf.train.load_checkpoint(os.path.join(export_path, "variables", "variables"))
    saved = [reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
             if name.endswith("VARIABLE_VALUE")]
    expected = [w.numpy() for w in model.variables] + decoding_copies(model, matmul_dtypes) \
        + list(extra)
    assert len(saved) == len(expected)
    for array in expected:
        match = [i for i, tensor in enumerate(saved) if tensor.shape == array.shape
                 and tensor.dtype == array.dtype and np.array_equal(tensor, array)]
        assert match, f"no saved tensor equals a {array.shape} weight"
        saved.pop(match[0])


def test_each_weight_is_saved_once_with_its_values(exported, module):
    assert_each_weight_saved_once(exported, module.model)


def test_the_searches_multiply_by_the_copies_the_export_keeps(exported):
    # The kept copies are what the search reads at each request: zero them in a loaded
    # export and its translations change (a search that prepared its own copies from the
    # weights would not see it); put them back and the translations are those before.
    import tensorflow_text  # noqa: F401  (the export's tokenizer ops)

    loaded = tf.saved_model.load(exported)
    serve = loaded.signatures["serving_default"]
    sentences = tf.constant(SENTENCES[:2])
    before = serve(sentences=sentences)
    kept = [copy.numpy() for copy in loaded.decoding_copies]
    for copy in loaded.decoding_copies:
        copy.assign(tf.zeros_like(copy))
    zeroed = serve(sentences=sentences)
    assert not np.allclose(zeroed["scores"], before["scores"], atol=1e-3)
    for copy, value in zip(loaded.decoding_copies, kept):
        copy.assign(value)
    again = serve(sentences=sentences)
    assert again["translations"].numpy().tolist() == before["translations"].numpy().tolist()
    np.testing.assert_allclose(again["scores"], before["scores"], rtol=1e-6)


def test_a_damaged_export_is_named_in_one_line(exported, tmp_path):
    from tfnmt.inference.loading import load_signatures
    from tfnmt.paths import DamagedFileError

    for damage in ("cut", "missing"):
        version = tmp_path / damage
        shutil.copytree(exported, version)
        variables = version / "variables"
        if damage == "cut":
            data = next(variables.glob("variables.data-*"))
            data.write_bytes(data.read_bytes()[:1000])
        else:
            (variables / "variables.index").unlink()
        with pytest.raises(DamagedFileError) as raised:
            load_signatures(export=str(version))
        message = str(raised.value)
        assert message.startswith(f"{version} does not load as a SavedModel: ")
        assert "\n" not in message and "experimental_io_device" not in message


def test_only_core_and_tf_text_ops(exported):
    core = set(dir(tf.raw_ops))
    ops = graph_ops(exported)
    unknown = {op for op in ops if op not in core and op not in TF_TEXT_OPS}
    assert not unknown, f"ops stock TF Serving may lack: {unknown}"
    assert not ops & FORBIDDEN
    assert {"SentencepieceTokenizeOp", "SentencepieceDetokenizeOp"} <= ops
    assert ops & {"While", "StatelessWhile"}  # the beam search is a graph loop


def test_versions_are_new_directories_never_overwritten(module, exported, tmp_path):
    assert os.path.basename(exported) == "1"
    export_dir = str(tmp_path / "export")  # a copy: `exported` is shared
    shutil.copytree(exported, os.path.join(export_dir, "1"))
    # What an export killed mid-write leaves (its process is gone), and one still being written.
    finished = subprocess.Popen(["true"])
    finished.wait()
    abandoned = os.path.join(export_dir, f".tmp-2-{finished.pid}")
    in_progress = os.path.join(export_dir, f".tmp-3-{os.getpid()}")
    for path in (abandoned, in_progress):
        os.makedirs(os.path.join(path, "variables"))
    # check=False: the C++ loader check (its own tests) would only add its seconds here.
    assert export_saved_model(module, export_dir, check=False).endswith(os.sep + "2")
    assert not os.path.exists(abandoned) and os.path.isdir(in_progress)
    shutil.rmtree(in_progress)
    with pytest.raises(FileExistsError):
        export_saved_model(module, export_dir, version=1)
    assert sorted(os.listdir(export_dir)) == ["1", "2"]  # no temporary left behind
    # Another export of the module, whose weights changed since: its copies follow them.
    embeddings = module.model.target_embedding.embeddings
    before = embeddings.numpy()
    embeddings.assign(before * 2.0)
    try:
        changed = export_saved_model(module, str(tmp_path / "changed"), check=False)
        assert_each_weight_saved_once(changed, module.model)
    finally:
        embeddings.assign(before)


def test_an_export_whose_version_another_export_published_meanwhile_takes_the_next(
        tmp_path, monkeypatch):
    # Two exports into one export_dir at once both choose the next version; the one that
    # publishes second used to fail ("Directory not empty"), its work lost. The writers are
    # stubbed: while this export is written, "another" publishes the version it chose.
    from tfnmt.inference import saved_model

    export_dir = tmp_path / "export"
    published, taken = [], [None]  # the version the other export publishes: the next one

    def write(module, path):
        os.makedirs(os.path.join(path, "variables"))
        with open(os.path.join(path, "saved_model.pb"), "w") as f:
            f.write(f"ours {len(published)}")
        other = export_dir / str(taken[0] or saved_model.next_version(str(export_dir)))
        other.mkdir()
        (other / "saved_model.pb").write_text("the other export's")
        published.append(other.name)

    monkeypatch.setattr(saved_model, "write_saved_model", write)
    monkeypatch.setattr(saved_model, "write_warmup_requests", lambda path: None)
    monkeypatch.setattr(saved_model, "write_search_settings", lambda path, searches: None)
    module = type("Module", (), {"parallel_searches": 2})()
    path = export_saved_model(module, str(export_dir), check=False)
    assert published == ["1"] and path == str(export_dir / "2")
    assert (export_dir / "1" / "saved_model.pb").read_text() == "the other export's"
    assert (export_dir / "2" / "saved_model.pb").read_text() == "ours 0"
    # A version asked for is not renumbered: refused, the other's kept, nothing left behind.
    taken[0] = 4
    with pytest.raises(FileExistsError, match=r"/4 was published by another export while "
                                              r"this one was written"):
        export_saved_model(module, str(export_dir), version=4, check=False)
    assert sorted(os.listdir(export_dir)) == ["1", "2", "4"]
    assert (export_dir / "4" / "saved_model.pb").read_text() == "the other export's"


def test_no_optimizer_slots_in_the_export(exported, module):
    variables = [v for v in tf.train.list_variables(os.path.join(exported, "variables",
                                                                 "variables"))
                 if v[0] != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    assert len(variables) == len(module.model.weights) + len(module.decoding_copies)
    assert not [name for name, _ in variables if "optimizer" in name]


def run_export_client(path, sentences):
    """tests/export_client.py in a fresh process: both loaders' outputs (see its docstring)."""
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "export_client.py"),
                             path], input=json.dumps(sentences), capture_output=True, text=True,
                            timeout=300,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT))
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def decoded(strings):
    return [s.decode("utf-8") for s in np.ravel(strings)]


def test_tf_serving_loader_answers_every_signature_as_python_and_eager_do(exported, module,
                                                                        tiny_model_dir):
    # TF Serving loads with TensorFlow's C++ LoadSavedModel and runs signatures by
    # Session::Run; a fresh process with nothing of tfnmt's model code does the same through
    # the C API, and also loads with tf.saved_model.load.
    loaded = run_export_client(exported, SENTENCES)
    assert loaded["tfnmt_modules"] == ["tfnmt", "tfnmt.inference",
                                       "tfnmt.inference.session_loader"]
    for name in ("serving_default", "translate_n_best"):
        session, python = loaded["session"][name], loaded["python"][name]
        assert session["shape"] == python["shape"]
        assert session["translations"] == python["translations"]
        np.testing.assert_allclose(session["scores"], python["scores"], rtol=1e-5, atol=1e-6)
    best, n_best = loaded["session"]["serving_default"], loaded["session"]["translate_n_best"]
    assert best["shape"] == [len(SENTENCES)] and n_best["shape"] == [len(SENTENCES), 2]
    # The same as the module in this process, traced and eager.
    expected = module.serve(tf.constant(SENTENCES))
    assert best["translations"] == decoded(expected["translations"])
    np.testing.assert_allclose(best["scores"], expected["scores"], rtol=1e-5, atol=1e-6)
    eager_translations, eager_scores = module.translate_batch(tf.constant(SENTENCES), 1)
    assert best["translations"] == decoded(eager_translations)
    np.testing.assert_allclose(best["scores"], np.ravel(eager_scores), rtol=1e-5, atol=1e-6)
    assert n_best["translations"] == decoded(module.serve_n_best(tf.constant(SENTENCES))[
        "translations"])
    # No content (empty, blanks of any kind) -> "" and 0, in both signatures.
    for index in [2] + list(range(4, len(SENTENCES))):
        assert best["translations"][index] == "" and best["scores"][index] == 0.0
        assert n_best["translations"][2 * index:2 * index + 2] == ["", ""]
    assert all(best["translations"][i] for i in (0, 1, 3))
    # A [2, 2] input is refused, not answered with the first sentence in every cell.
    assert "INVALID_ARGUMENT" in loaded["rank_2_error"]
    assert "rank-1 string tensor" in loaded["rank_2_error"]
    check_score_and_prefix_signatures(loaded, module, tiny_model_dir)


def test_a_traced_signature_refuses_input_of_another_rank_in_one_line(module):
    # The graph optimizer knows the signatures' inputs as rank 1 ([None]) and would fold a
    # check of that rank away; a column [B, 1], a [2, 2] table or a scalar is refused by the
    # check itself, not met later by an error of some op inside the search.
    cases = [("serve", [tf.constant([["Das ist gut."], ["Ja."]])], "sentences", 2),
             ("serve", [tf.constant([["a", "b"], ["c", "d"]])], "sentences", 2),
             ("serve", [tf.constant("Das ist gut.")], "sentences", 0),
             ("serve_with_prefix", [tf.constant(["Ja."]), tf.constant([["Yes"]])], "prefixes", 2),
             ("score", [tf.constant([["Ja."]]), tf.constant(["Yes."])], "sentences", 2)]
    for name, inputs, input_name, rank in cases:
        function = getattr(module, name).get_concrete_function()
        with pytest.raises(tf.errors.InvalidArgumentError) as raised:
            function(*inputs)
        assert (f"`{input_name}` must be a rank-1 string tensor [B]; got rank] [{rank}]"
                in str(raised.value)), (name, inputs, str(raised.value)[:500])


def check_score_and_prefix_signatures(loaded, module, tiny_model_dir):
    """The `score` and `translate_with_prefix` answers of `run_export_client`."""
    # Forced decoding through TF Serving's loader and tf.saved_model.load, each sentence
    # scored with its beam translation as the target, against numpy over the model's logits.
    score = loaded["score"]
    proto = open(os.path.join(tiny_model_dir, "spm.model"), "rb").read()
    for name in ("session", "python"):
        assert len(score[name]["scores"]) == len(SENTENCES)
    for i, (source, target) in enumerate(zip(SENTENCES, score["targets"])):
        expected, length = teacher_forced_log_prob(module.model, proto, source, target)
        assert score["session"]["lengths"][i] == length
        assert score["session"]["scores"][i] == pytest.approx(expected, rel=1e-4, abs=1e-4)
        assert score["python"]["scores"][i] == pytest.approx(expected, rel=1e-4, abs=1e-4)
    # Translations that must start with given text, through TF Serving's loader: each starts
    # with its prefix; a sentence without content still gives "".
    prefix = loaded["prefix"]
    for i, (translation, text) in enumerate(zip(prefix["session"]["translations"],
                                                prefix["prefixes"])):
        assert translation.startswith(text) if i in (0, 1, 3) else translation == ""
    # Unequal counts and a [2, 2] input are refused.
    with pytest.raises(tf.errors.InvalidArgumentError, match="as many strings"):
        module.score(tf.constant(["a", "b"]), tf.constant(["a"]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="`targets` must be a rank-1"):
        module.score_batch(tf.constant(["a"]), tf.constant([["a"]]))


def test_export_that_the_cpp_loader_cannot_run_is_never_published(module, tmp_path,
                                                                  monkeypatch):
    # The check export_saved_model makes before the rename: a SavedModel whose signatures
    # fail under the C++ loader (here: written by tf.saved_model.save of an object holding the
    # Keras model, so that the variables the graph reads are never restored) raises and
    # leaves no version and no temporary behind: nothing, not even the export_dir it made.
    from tfnmt.inference import saved_model

    def plain_save(module, path):
        tracked = tf.Module()
        tracked.model, tracked.tokenizer = module.model, module.source_tokenizer
        # The searches' copies (where an earlier export of the module made them; a save
        # reuses its traces).
        tracked.copies = list(module.decoding_copies.values())
        tf.saved_model.save(tracked, path, signatures={
            "serving_default": module.serve, "translate_n_best": module.serve_n_best})

    monkeypatch.setattr(saved_model, "write_saved_model", plain_save)
    with pytest.raises(ExportCheckError, match="Could not find variable"):
        saved_model.export_saved_model(module, str(tmp_path / "export"))
    assert not os.path.exists(tmp_path / "export")


def test_tf_serving_warms_up_every_signature(exported, tmp_path):
    # assets.extra/tf_serving_warmup_requests, as TF Serving's SavedModel Warmup reads it: a
    # TFRecord of PredictionLog protos, here one Predict request per signature, read with the
    # tensorflow-serving-api protos.
    from tensorflow_serving.apis import prediction_log_pb2

    from tfnmt.inference import saved_model

    warmup = os.path.join(exported, "assets.extra", "tf_serving_warmup_requests")
    logs = [prediction_log_pb2.PredictionLog.FromString(record)
            for record in tf.data.TFRecordDataset(warmup).as_numpy_iterator()]
    assert [log.WhichOneof("log_type") for log in logs] == ["predict_log"] * 4
    requests = {log.predict_log.request.model_spec.signature_name:
                {k: tf.make_ndarray(v).tolist() for k, v in log.predict_log.request.inputs.items()}
                for log in logs}
    sentences = [b"Guten Morgen!", b""]
    assert requests == {"serving_default": {"sentences": sentences},
                        "translate_n_best": {"sentences": sentences},
                        "translate_with_prefix": {"sentences": sentences, "prefixes": sentences},
                        "score": {"sentences": sentences, "targets": sentences}}
    # The export's check runs the file's requests: a file without a signature's request, a
    # request for a signature the export does not have, or one missing an input, fails it.
    copy = str(tmp_path / "copy")
    shutil.copytree(exported, copy)
    original = [log.SerializeToString() for log in logs]
    sideways = prediction_log_pb2.PredictionLog.FromString(original[0])
    sideways.predict_log.request.model_spec.signature_name = "translate_sideways"
    no_prefixes = prediction_log_pb2.PredictionLog.FromString(original[2])
    del no_prefixes.predict_log.request.inputs["prefixes"]
    for records, message in ((original[1:] + [sideways.SerializeToString()],
                              "no request for serving_default"),
                             ([sideways.SerializeToString()] + original,
                              "'translate_sideways', which the export does not have"),
                             ([no_prefixes.SerializeToString()] + original[:2] + original[3:],
                              r"translate_with_prefix takes inputs \['prefixes', 'sent")):
        with tf.io.TFRecordWriter(os.path.join(copy, saved_model.WARMUP_FILE)) as writer:
            for record in records:
                writer.write(record)
        with pytest.raises(ExportCheckError, match=message):
            saved_model.check_with_session_loader(copy)


def test_no_paths_of_the_training_machine_in_the_export(exported, module, tiny_model_dir):
    import tensorflow_text as tf_text

    with open(os.path.join(exported, "saved_model.pb"), "rb") as f:
        graph = f.read()
    assert b"private-run-7f3a" not in graph and b"/home/trainer" not in graph
    # The SentencePiece model it holds instead tokenizes as the original does.
    with open(os.path.join(tiny_model_dir, "spm.model"), "rb") as f:
        original = tf_text.SentencepieceTokenizer(model=with_training_path(f.read()))
    text = tf.constant(SENTENCES + ["Überall grüßt ein Wörterbuch: ½ € © \x00 ẞ"])
    assert module.target_tokenizer is module.source_tokenizer  # a shared vocabulary
    assert original.tokenize(text).to_list() == \
        module.source_tokenizer.tokenize(text).to_list()


def test_saved_model_cli_lists_the_signatures(exported):
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    result = subprocess.run([cli, "show", "--dir", exported, "--all"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    for text in ("signature_def['serving_default']", "signature_def['translate_n_best']",
                 "inputs['sentences']", "outputs['translations']", "outputs['scores']"):
        assert text in result.stdout


def test_saved_model_cli_runs_the_export_with_tensorflow_text_loaded(exported, serving_fn):
    # docs/serving.md's command: saved_model_cli's program with tensorflow-text's ops
    # registered (its own binary stops at the SentencePiece op). The Session route gives the
    # scores of tf.saved_model.load's.
    command = ("import sys, tensorflow_text; from tensorflow.python.tools.saved_model_cli "
               "import main; sys.exit(main())")
    result = subprocess.run(
        [sys.executable, "-c", command, "run", "--dir", exported, "--tag_set", "serve",
         "--signature_def", "serving_default", "--input_exprs", f"sentences={SENTENCES!r}"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    printed = result.stdout.split("Result for output key scores:\n")[1].split("Result for")[0]
    scores = np.array(printed.replace("[", " ").replace("]", " ").split(), dtype=np.float32)
    expected = serving_fn(sentences=tf.constant(SENTENCES))["scores"].numpy()
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def serving_fn(exported):
    import tensorflow_text  # noqa: F401

    return tf.saved_model.load(exported).signatures["serving_default"]


def test_bad_input_has_defined_results(serving_fn):
    empty_batch = serving_fn(sentences=tf.constant([], tf.string))
    assert empty_batch["translations"].shape == (0,) and empty_batch["scores"].shape == (0,)
    huge = " ".join(["Haus"] * 5000)  # far beyond max_length: truncated, not a crash
    # No content: empty, ASCII or Unicode blanks, bytes that are all invalid UTF-8.
    no_content = ["", "   ", "\u00a0\u200b".encode(), b"\xff\xfe\xc3", b"\x80 \xe2\x80\xa8 \xff"]
    out = serving_fn(sentences=tf.constant(no_content + [huge, b"kaputt \xff\xfe"]))
    translations = out["translations"].numpy().tolist()
    count = len(no_content)
    assert translations[:count] == [b""] * count
    assert out["scores"].numpy()[:count].tolist() == [0.0] * count
    assert all(translations[count:])
    for text in translations[count:]:
        text.decode("utf-8")  # valid UTF-8 whatever came in
    assert np.all(np.isfinite(out["scores"].numpy()))


def test_the_export_tells_which_sources_it_reads_in_part(exported, serving_fn, tiny_model_dir):
    from tfnmt.inference import loading

    with open(os.path.join(tiny_model_dir, "spm.model"), "rb") as f:
        pieces = sentencepiece.SentencePieceProcessor(model_proto=f.read())
    long = " ".join(["Das Haus ist rot, und"] * 20)
    # Its first 63 subwords (all the model reads: max_length 64, then EOS) and 64, as text.
    start, one_more = (pieces.decode(pieces.encode(long)[:n]) for n in (63, 64))
    sentences = ["Das ist ein Haus.", long, "", "kaputt \ufffd", start, one_more]
    expected = [len(pieces.encode(s)) for s in sentences]  # the sentencepiece package's count
    assert expected[1] > 64 and expected[2] == 0 and expected[4:] == [63, 64]
    signatures = loading.load_signatures(export=exported)
    subwords, max_subwords = signatures["source_lengths"](sentences)
    assert subwords.tolist() == expected and max_subwords == 63
    # What the long one's translation covers: the translation of its first 63 subwords.
    # (Each alone: the same shapes, so the same kernels.)
    translations = [serving_fn(sentences=tf.constant([s]))["translations"].numpy()[0]
                    for s in (long, start)]
    assert translations[0] == translations[1] and translations[0]
    assert loading.long_sources(signatures, sentences, first_line=11) == (
        f"lines 12 ({expected[1]} subwords) and 16 (64 subwords) are longer than the 63 "
        "subwords the model reads: each translation covers its line's first 63 (split long "
        "lines into sentences)")
    assert loading.long_sources(signatures, sentences[:5]) == (
        f"line 2 ({expected[1]} subwords) is longer than the 63 subwords the model reads: its "
        "translation covers the first 63 (split long lines into sentences)")
    assert loading.long_sources(signatures, sentences[:1] + sentences[2:5]) is None
    assert loading.long_sources(signatures, [long], output="score").endswith(
        "its score covers the first 63 (split long lines into sentences)")
    many = loading.long_sources(signatures, [long] * 12 + ["Ja."], most_named=10,
                                unit="sentence")
    assert many.startswith(f"sentences 1 ({expected[1]} subwords), 2 ({expected[1]} subwords)")
    assert f"10 ({expected[1]} subwords) and 2 more are longer than the 63 subwords" in many
    assert many.endswith("each translation covers its sentence's first 63")
    # An export made without the function: nothing to tell, translations as before.
    assert loading.long_sources({"serving_default": signatures["serving_default"]},
                                sentences) is None


def test_concurrent_calls_give_correct_results(serving_fn):
    sentences = [[f"Satz Nummer {i}.", "Das Haus ist rot."] for i in range(6)]
    expected = [serving_fn(sentences=tf.constant(s))["translations"].numpy().tolist()
                for s in sentences]
    results = [None] * len(sentences)

    def worker(i):
        for _ in range(3):
            results[i] = serving_fn(sentences=tf.constant(sentences[i]))[
                "translations"].numpy().tolist()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(sentences))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert results == expected


def test_a_sentences_translation_does_not_depend_on_its_batch(serving_fn, small_corpus):
    # TF Serving batches the requests of different clients together. Sentences of different
    # lengths (the untrained model runs each to its length limit, the case that depended on
    # the batch's longest source), alone and in random batches: float32 gives the same
    # translations, and scores to rounding.
    with open(small_corpus["dev"], encoding="utf-8") as f:
        sources = [line.split("\t")[0] for line in f.read().splitlines()[:40]]
    sources = sorted(sources, key=len)[::4]  # 10 lengths, short to long
    alone = [serving_fn(sentences=tf.constant([s])) for s in sources]
    order = np.random.default_rng(0).permutation(len(sources))
    for batch in np.array_split(order, 3):
        out = serving_fn(sentences=tf.constant([sources[i] for i in batch]))
        for row, i in enumerate(batch):
            assert out["translations"][row] == alone[i]["translations"][0]
            np.testing.assert_allclose(out["scores"][row], alone[i]["scores"][0], rtol=1e-4)


@pytest.mark.parametrize("batch", [0, 1, 5])
def test_chunks_give_each_sentence_what_one_search_gives(module, batch, tiny_model_dir):
    # A request larger than chunk_size is translated chunk after chunk.
    proto = checkpoints.load_model(tiny_model_dir)[1]
    chunked = TranslationModule(module.model, proto, beam_size=3, alpha=0.6, n_best=2,
                                chunk_size=2)
    sentences = tf.constant((SENTENCES + ["Und Gott sah, dass es gut war."])[:batch], tf.string)
    expected, got = module.serve_n_best(sentences), chunked.serve_n_best(sentences)
    assert got["translations"].shape == (batch, 2)
    np.testing.assert_array_equal(got["translations"], expected["translations"])
    np.testing.assert_allclose(got["scores"], expected["scores"], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="chunk_size"):
        TranslationModule(module.model, proto, chunk_size=0)


@pytest.mark.parametrize("rule", ["finished", "bound"])
def test_the_beam_stop_rule_reaches_the_search(module, rule, tiny_model_dir, monkeypatch):
    # The rules themselves are checked against a plain search in test_beam_search.py.
    import tfnmt.inference.serving as serving

    rules = []

    def spy(*args, stop, **kwargs):
        rules.append(stop)
        return beam_search(*args, stop=stop, **kwargs)

    monkeypatch.setattr(serving, "beam_search", spy)
    proto = checkpoints.load_model(tiny_model_dir)[1]
    chosen = TranslationModule(module.model, proto, beam_size=3, n_best=2, beam_stop=rule)
    chosen.translate_batch(tf.constant(SENTENCES[:2]), 2)
    assert rules and set(rules) == {rule}
    with pytest.raises(ValueError, match="beam_stop"):
        TranslationModule(module.model, proto, beam_stop="never")


def test_the_no_repeat_rule_reaches_every_beam_search(module, tiny_model_dir, monkeypatch):
    # The rule itself is checked against a plain search in test_beam_search.py.
    import tfnmt.inference.serving as serving

    sizes = []

    def spy(search):
        def spied(*args, no_repeat_ngram_size, **kwargs):
            sizes.append(no_repeat_ngram_size)
            return search(*args, no_repeat_ngram_size=no_repeat_ngram_size, **kwargs)
        return spied

    monkeypatch.setattr(serving, "beam_search", spy(serving.beam_search))
    monkeypatch.setattr(serving, "beam_search_alphas", spy(serving.beam_search_alphas))
    proto = checkpoints.load_model(tiny_model_dir)[1]
    chosen = TranslationModule(module.model, proto, beam_size=3, n_best=2,
                               no_repeat_ngram_size=3)
    chosen.translate_batch(tf.constant(SENTENCES[:2]), 2)
    chosen.translate_batch(tf.constant(SENTENCES[:2]), 1, alphas=[0.6, 1.2])
    assert len(sizes) >= 2 and set(sizes) == {3}
    with pytest.raises(ValueError, match="no_repeat_ngram_size applies to beam search"):
        TranslationModule(module.model, proto, n_best=1, no_repeat_ngram_size=3,
                          sampling={"temperature": 1.0, "top_k": 0, "seed": 0})
    with pytest.raises(ValueError, match="no_repeat_ngram_size"):
        TranslationModule(module.model, proto, no_repeat_ngram_size=-1)


GRAPPLER_LOG = {"TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": "meta_optimizer=1"}
GRAPPLER_ITEM = "Starting optimization for grappler item"  # one line per function rewritten


def test_the_translation_programs_search_without_graph_rewrites_on_a_cpu(tiny_model_dir,
                                                                         exported, tmp_path):
    # TensorFlow logs each function Grappler rewrites (GRAPPLER_LOG). Where a GPU's device file
    # exists the rewrites stay, without one they stop, in the same process.
    (tmp_path / "nvidia0").touch()
    code = ("import sys, tensorflow as tf\n"
            "from tfnmt.inference.loading import skip_graph_rewrites\n"
            "double = lambda: tf.function(lambda x: 2 * x + tf.reduce_sum(x))(tf.ones([3]))\n"
            f"print(skip_graph_rewrites(gpu_files=({str(tmp_path / 'nvidia[0-9]*')!r},)))\n"
            "double()\n"
            "print('--', file=sys.stderr, flush=True)\n"
            "print(skip_graph_rewrites(gpu_files=()))\n"
            "double()\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=120, env=dict(os.environ, **GRAPPLER_LOG))
    assert result.returncode == 0 and result.stdout.split() == ["False", "True"], result.stderr
    with_gpu, without = result.stderr.split("\n--\n")
    assert GRAPPLER_ITEM in with_gpu and GRAPPLER_ITEM not in without
    # translate.py from an export, evaluate.py from a model_dir's checkpoint: their searches
    # run unrewritten, and translate.
    translated = python("translate.py", f"--export={exported}", "--input=-",
                        input="Guten Morgen!\n", env=GRAPPLER_LOG)
    assert translated.returncode == 0 and translated.stdout.count("\n") == 1, translated.stderr
    assert GRAPPLER_ITEM not in translated.stderr
    (tmp_path / "in.de").write_text("Guten Morgen!\nDas ist ein Haus.\n", encoding="utf-8")
    (tmp_path / "ref.en").write_text("Good morning!\nThis is a house.\n", encoding="utf-8")
    scored = python("evaluate.py", f"--model_dir={tiny_model_dir}", "--beam_size=2",
                    f"--source={tmp_path / 'in.de'}", f"--reference={tmp_path / 'ref.en'}",
                    env=GRAPPLER_LOG)
    assert scored.returncode == 0 and "BLEU" in scored.stdout, scored.stderr[-3000:]
    assert GRAPPLER_ITEM not in scored.stderr


def test_translate_and_evaluate_commands(tiny_model_dir, exported, small_corpus, tmp_path):
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")

    def run(*args, stdin="", returncode=0, stderr=False):
        result = subprocess.run([*entry_point_command(args[0], environment), *args[1:]],
                                cwd=ROOT, input=stdin.encode(), capture_output=True,
                                timeout=300, env=environment)
        assert result.returncode == returncode, result.stderr[-3000:]
        # No spurious oneDNN error line (an int Transpose's) where oneDNN runs.
        assert b"oneDNN supports DT_" not in result.stderr
        if stderr:
            return result.stdout.decode(), result.stderr.decode()
        return result.stdout.decode() if returncode == 0 else result.stderr.decode()

    # From the export, stdin -> stdout, one line out per line in: lines end at \n or \r\n
    # only; VT, FF, FS, GS, RS, NEL, U+2028, U+2029 and a lone CR stay inside their line.
    # A line longer than the model reads is named on stderr, with its subwords (the
    # sentencepiece package's count).
    breaks = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\r"]
    long = " ".join(["Das Haus ist rot, und"] * 20)
    lines = [f"Das ist{b}ein Haus." for b in breaks] + ["", "Guten Morgen!\r", long]
    out, error = run("translate.py", f"--export={os.path.dirname(exported)}",
                     stdin="\n".join(lines), stderr=True)
    assert out.count("\n") == len(lines) and out.endswith("\n")
    assert out.split("\n")[len(breaks)] == ""  # the empty line stays empty
    with open(os.path.join(tiny_model_dir, "spm.model"), "rb") as f:
        pieces = sentencepiece.SentencePieceProcessor(model_proto=f.read())
    assert error.strip().splitlines()[-1] == (
        f"translate.py: line {len(lines)} ({len(pieces.encode(long))} subwords) is longer than "
        "the 63 subwords the model reads: its translation covers the first 63 (split long "
        "lines into sentences)")
    assert "UTF-8" not in error
    # Paths that cannot work fail at once, in one line.
    for flag, message in ((f"--input={tmp_path}", "is a directory"),
                          (f"--output={tmp_path / 'missing' / 'out.en'}", "does not exist")):
        error = run("translate.py", f"--export={os.path.dirname(exported)}", flag,
                    returncode=1)
        assert message in error and len(error.strip().splitlines()) == 1, error
    for flag, message in ((f"--plot_attention={exported}/saved_model.pb",
                           "is a file, not a directory"),
                          ("--plot_attention=/sys/plots", "cannot write in it")):  # sysfs
        error = run("translate.py", f"--model_dir={tiny_model_dir}", flag, returncode=1)
        assert message in error and len(error.strip().splitlines()) == 1, error
    # An output that fills the disk (/dev/full) fails in one line too, after translating.
    error = run("translate.py", f"--export={os.path.dirname(exported)}", "--output=/dev/full",
                stdin="Guten Morgen!\n", returncode=1)
    assert error.strip().splitlines()[-1] == ("translate.py: /dev/full: No space left on device; "
                                              "0 lines were written in full before it")
    assert "Traceback" not in error
    # From the checkpoint, file -> file, with attention plots of the first sentence; a line in
    # Latin-1 is translated as read with U+FFFD, and named.
    source = tmp_path / "in.de"
    source.write_bytes("Er sprach zu ihnen.\n".encode() + "Grüße.\n".encode("latin-1"))
    plots = tmp_path / "plots"
    _, error = run("translate.py", f"--model_dir={tiny_model_dir}", f"--input={source}",
                   f"--output={tmp_path / 'out.en'}", "--beam_size=2",
                   f"--plot_attention={plots}", stderr=True)
    translations = (tmp_path / "out.en").read_text(encoding="utf-8").splitlines()
    assert len(translations) == 2
    assert (f"translate.py: {source}: line 2 is not valid UTF-8: U+FFFD stands for the "
            "invalid bytes (a file in another encoding? `iconv -f latin1 -t utf-8` converts "
            "Latin-1)") in error.splitlines()
    names = sorted(os.listdir(plots))
    assert names == sorted(f"{kind}_layer_{i}.png" for kind in
                           ("encoder_self", "decoder_self", "decoder_cross") for i in (0, 1))
    image = tf.io.decode_png(tf.io.read_file(str(plots / "encoder_self_layer_0.png")))
    height, width, channels = image.shape  # 4 square heads side by side, pieces as text
    assert channels == 3 and width > 2 * height and (image.numpy().max(axis=2) < 40).any()
    # Without repeating a subword: other translations (the untrained model repeats itself).
    run("translate.py", f"--model_dir={tiny_model_dir}", f"--input={source}",
        f"--output={tmp_path / 'once.en'}", "--beam_size=2", "--no_repeat_ngram_size=1")
    once = (tmp_path / "once.en").read_text(encoding="utf-8").splitlines()
    assert len(once) == 2 and once != translations
    # evaluate.py on the dev split named by the model_dir's settings.
    import json as json_module
    settings_path = os.path.join(tiny_model_dir, "settings.json")
    settings = json_module.load(open(settings_path))
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for name in os.listdir(tiny_model_dir):
        if name != "settings.json":
            os.symlink(os.path.join(tiny_model_dir, name), model_dir / name)
    dev = tmp_path / "dev.tsv"  # the first 20 pairs: the path is under test, not the model
    dev.write_text("".join(open(small_corpus["dev"], encoding="utf-8").readlines()[:20]),
                   encoding="utf-8")
    # A run that translates English to German (train.py --reverse).
    settings["data"] = {"dataset": "files", "files": dict(small_corpus, dev=str(dev)),
                        "reverse": True}
    (model_dir / "settings.json").write_text(json_module.dumps(settings))
    out, error = run("evaluate.py", f"--model_dir={model_dir}", "--split=dev", "--beam_size=1",
                     stderr=True)
    assert out.startswith("dev split: 20 sentences\n  BLEU ") and "\n  chrF2 " in out
    # The sentences longer than the model reads are named, as numbered in the split: the
    # English ones, the sources of this run.
    pairs = [line.split("\t")[:2] for line in dev.read_text(encoding="utf-8").splitlines()]
    long, german_long = ([(n, len(pieces.encode(s))) for n, s in enumerate(sources, 1)
                          if len(pieces.encode(s)) > 63]
                         for sources in ([e for _, e in pairs], [g for g, _ in pairs]))
    assert len(long) > 1 and long != german_long
    named = [f"{n} ({count} subwords)" for n, count in long[:10]]  # the first ten, then a count
    named += [f"{len(long) - 10} more"] if len(long) > 10 else []
    assert error.strip().splitlines()[-1] == (
        f"evaluate.py: of the 20 sources, sentences {', '.join(named[:-1])} and {named[-1]} "
        "are longer than the 63 subwords the model reads: each translation covers its "
        "sentence's first 63")
    # An empty split: one clear line, not sacrebleu's IndexError.
    (tmp_path / "empty.tsv").write_text("")
    settings["data"]["files"] = dict(small_corpus, dev=str(tmp_path / "empty.tsv"))
    (model_dir / "settings.json").write_text(json_module.dumps(settings))
    error = run("evaluate.py", f"--model_dir={model_dir}", "--split=dev", returncode=1)
    assert "holds no sentence pairs" in error and "Traceback" not in error


@pytest.mark.parametrize("signal_name, said", [("SIGINT", "interrupted"),
                                               ("SIGTERM", "stopped by SIGTERM")])
def test_ctrl_c_tells_how_many_input_lines_the_output_file_holds(signal_name, said, exported,
                                                                  small_corpus, tmp_path):
    # Stopped while it waits for more input, by Ctrl-C or by SIGTERM (a batch job's time
    # limit), translate.py says how far its --output got, so that a long job can go on from
    # the next line (windows are written whole).
    import signal

    with open(small_corpus["dev"], encoding="utf-8") as f:
        sources = [line.split("\t")[0] for line in f.read().splitlines()[:64]]
    pipe, output = tmp_path / "in.de", tmp_path / "out.en"
    os.mkfifo(pipe)
    process = started("translate.py", f"--export={os.path.dirname(exported)}",
                      "--batch_size=1", f"--input={pipe}", f"--output={output}")
    errors = []
    reader = threading.Thread(target=lambda: errors.extend(process.stderr), daemon=True)
    reader.start()
    try:
        with open(pipe, "w", encoding="utf-8") as source:  # opens once translate.py reads it
            source.write("".join(s + "\n" for s in sources))
            source.flush()
            # The progress line comes once the window is written and counted.
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and process.poll() is None and not any(
                    line.startswith("translate.py: 64 lines (") for line in list(errors)):
                time.sleep(0.05)
            signum = getattr(signal, signal_name)
            process.send_signal(signum)  # as it waits for the next window's lines
            process.wait(timeout=240)
    finally:
        process.kill()
    reader.join(timeout=60)
    assert process.returncode == 128 + signum, "".join(errors)[-3000:]
    assert errors[-1].rstrip("\n") == (
        f"translate.py: {said}; {output} holds the output of the first 64 input lines "
        "(--resume goes on from there)")
    assert len(output.read_text(encoding="utf-8").splitlines()) == 64


def test_translate_py_resumes_where_its_output_file_ends(exported, serving_fn, small_corpus,
                                                         tmp_path):
    # --resume: the output of a run stopped after its first window (64 lines at --batch_size=1)
    # is kept, a killed run's partial line or damaged gzip end is left out and translated
    # again, and the lines after it are appended: the file ends as an uninterrupted run's. A
    # file that holds more than the input, or n-best lists not of this input's numbering, is
    # refused before any work and left as it was.
    import gzip

    from helpers import python

    with open(small_corpus["dev"], encoding="utf-8") as f:
        sources = [line.split("\t")[0] for line in f.read().splitlines()[:70]]
    (tmp_path / "in.de").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    export = f"--export={os.path.dirname(exported)}"
    common = [export, "--batch_size=1", f"--input={tmp_path / 'in.de'}", "--resume"]
    expected = [t.decode() for t in
                serving_fn(sentences=tf.constant(sources))["translations"].numpy()]
    out = tmp_path / "out.en"
    out.write_bytes("".join(t + "\n" for t in expected[:64]).encode() + b"Half a tra")
    resumed = python("translate.py", *common, f"--output={out}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert out.read_text(encoding="utf-8").splitlines() == expected
    assert resumed.stderr.splitlines()[:2] == [
        f"translate.py: --output {out} ends in 10 bytes after the output of its first input "
        "lines, left out: those lines are translated again",
        f"translate.py: --output {out} holds the output of the first 64 input lines: going on "
        "from the next"]
    again = python("translate.py", *common, f"--output={out}")
    assert again.returncode == 0 and again.stderr.strip() == (
        f"translate.py: --output {out} holds the output of all 70 input lines already")
    assert out.read_text(encoding="utf-8").splitlines() == expected

    # n-best lists, gzip-compressed, of a run killed as it wrote line 2 of list 65: the
    # numbering goes on from 64 (each list the export's for its sentence alone, as searched
    # at --batch_size=1; the scores to float32 rounding: translate.py runs the graph without
    # TensorFlow's rewrites, this process with them).
    translate_n_best = tf.saved_model.load(exported).signatures["translate_n_best"]
    lists = []
    for n, sentence in enumerate(sources):
        found = translate_n_best(sentences=tf.constant([sentence]))
        lists += [f"{n} ||| {t.decode()} ||| {v:.6f}" for t, v in
                  zip(found["translations"].numpy()[0][:2], found["scores"].numpy()[0][:2])]
    out_gz = tmp_path / "out.en.gz"
    stream = gzip.compress("".join(line + "\n" for line in lists[:130]).encode())
    out_gz.write_bytes(stream[:-12])  # ends part way: no gzip trailer
    resumed = python("translate.py", *common, "--n_best=2", f"--output={out_gz}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    with gzip.open(out_gz, "rt", encoding="utf-8") as f:
        written = [line.rsplit(" ||| ", 1) for line in f.read().splitlines()]
    expected_lists = [line.rsplit(" ||| ", 1) for line in lists]
    assert [text for text, _ in written] == [text for text, _ in expected_lists]
    np.testing.assert_allclose([float(v) for _, v in written],
                               [float(v) for _, v in expected_lists], rtol=1e-5)
    assert "ends in a damaged gzip stream after the output" in resumed.stderr

    # Refused before any work, the file unchanged: more output than input; lists numbered
    # otherwise; --resume without an output file; standard input that ends first.
    too_long = tmp_path / "long.en"
    too_long.write_text("x\n" * 71)
    refused = python("translate.py", *common, f"--output={too_long}")
    assert refused.returncode == 1 and refused.stderr.strip() == (
        f"translate.py: --output {too_long} holds the output of 71 input lines, more than the "
        "input's 70: it is not this input's output (give another --output, or drop --resume)")
    assert too_long.read_text() == "x\n" * 71
    refused = python("translate.py", *common, "--n_best=4", f"--output={out_gz}")
    assert refused.returncode == 1 and refused.stderr.strip() == (
        f"translate.py: --output {out_gz}: its 140 lines are not the --n_best=4 lists of the "
        "first 35 input lines (line 140 would start '34 ||| '): give another --output, or "
        "drop --resume")
    not_gzip = tmp_path / "plain.en.gz"
    not_gzip.write_text("A house.\n")
    big_tail = tmp_path / "binary.en"
    big_tail.write_bytes(b"A house.\n" + bytes(2 << 20))
    for path, message in (
            (not_gzip, f"--output {not_gzip}: unreadable after 0 lines (Not a gzipped file "
                       "(b'A ')): give another --output, or drop --resume"),
            (big_tail, f"--output {big_tail} ends in 2,097,152 bytes after its 1 line, more "
                       "than a killed run leaves of its output: it is not this input's output "
                       "(give another --output, or drop --resume)")):
        held = path.read_bytes()
        refused = python("translate.py", *common, f"--output={path}")
        assert refused.returncode == 1 and refused.stderr.strip() == f"translate.py: {message}"
        assert path.read_bytes() == held
    refused = python("translate.py", export, "--resume")
    assert refused.returncode == 1 and refused.stderr.strip() == (
        "translate.py: --resume goes on from where an --output file ends: give --output")
    refused = python("translate.py", export, "--resume", "--output=/dev/null")
    assert refused.returncode == 1 and refused.stderr.strip() == (
        "translate.py: --resume reads what --output holds, and /dev/null is not a file (a pipe "
        "or a device): drop --resume")
    short = python("translate.py", export, f"--output={out}", "--resume", input="Ein Haus.\n")
    assert short.returncode == 1 and short.stderr.strip().splitlines()[-1] == (
        f"translate.py: the input ends after 1 line, and --output {out} holds the output of 70: "
        "it is not this input's output (give another --output, or drop --resume)")
    assert out.read_text(encoding="utf-8").splitlines() == expected


def test_translate_py_writes_each_window_before_reading_the_next(exported, serving_fn,
                                                                   small_corpus, tmp_path):
    # A window is 64 batches: with --batch_size=1, 64 lines. Its translations come out while
    # the input is still open (a large file streams in bounded memory, and what is done is on
    # disk if the run stops), each what the export gives the sentence alone. The input is a
    # named pipe, as `--input=<(zcat news.de.gz)` gives: read once, not consumed by a count. A
    # reader that goes away (`| head`) ends the program as it ends Unix tools, without a
    # traceback.
    with open(small_corpus["dev"], encoding="utf-8") as f:
        sources = [line.split("\t")[0] for line in f.read().splitlines()[:64]]
    pipe = tmp_path / "in.de"
    os.mkfifo(pipe)
    process = started("translate.py", f"--export={os.path.dirname(exported)}",
                      "--batch_size=1", f"--input={pipe}")
    received = []

    def read():
        for line in process.stdout:
            received.append(line)
            if len(received) == 64:
                return

    reader = threading.Thread(target=read)
    reader.start()
    opened = []  # a pipe opens for writing once translate.py opens it for reading
    opener = threading.Thread(target=lambda: opened.append(open(pipe, "w", encoding="utf-8")),
                              daemon=True)
    opener.start()
    opener.join(timeout=240)
    if not opened:  # never opened: free the opener, then say why
        os.close(os.open(pipe, os.O_RDONLY | os.O_NONBLOCK))
        process.kill()
        pytest.fail(f"translate.py never read its input: {process.stderr.read()[-3000:]}")
    with opened[0] as source:
        source.write("".join(s + "\n" for s in sources))
        source.flush()
        reader.join(timeout=240)
        assert len(received) == 64, process.stderr.read() if process.poll() is not None else ""
        expected = serving_fn(sentences=tf.constant(sources))["translations"].numpy()
        assert [line.rstrip("\n") for line in received] == [t.decode() for t in expected]
        process.stdout.close()  # the reader goes away: the next window's output has nowhere
        source.write("".join(s + "\n" for s in sources[:3]))
    assert process.wait(timeout=240) == 128 + 13  # SIGPIPE's exit code
    errors = process.stderr.read()
    assert "Traceback" not in errors and "translate.py: 64 lines (" in errors  # progress


def test_translate_py_answers_each_line_typed_at_a_terminal(exported, serving_fn):
    # stdin a terminal (a pseudo-terminal here): each line is translated once entered, without
    # waiting for a window of lines or the end of input.
    import pty

    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "translate.py"),
         f"--export={os.path.dirname(exported)}"], cwd=ROOT, stdin=terminal,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    os.close(terminal)
    answers = []
    reader = threading.Thread(target=lambda: answers.append(process.stdout.readline()))
    reader.start()
    try:
        os.write(controller, "Das ist ein Haus.\n".encode())
        reader.join(timeout=240)
        assert answers, "no answer before the end of input"
        expected = serving_fn(sentences=tf.constant(["Das ist ein Haus."]))["translations"]
        assert answers[0] == expected.numpy()[0].decode() + "\n"
        os.write(controller, b"\x04")  # Ctrl-D: the end of input
        assert process.wait(timeout=120) == 0, process.stderr.read()[-3000:]
        assert "translate.py: type a sentence per line (Ctrl-D ends)" in process.stderr.read()
    finally:
        process.kill()
        os.close(controller)


LOOPS = ("While", "StatelessWhile")


def loops_and_loop_calls(function):
    """(loops in a tf.function's graph and the functions it calls, calls of functions that hold
    a loop themselves)."""
    graph_def = function.get_concrete_function().graph.as_graph_def()
    nodes = list(graph_def.node) + [node for f in graph_def.library.function
                                    for node in f.node_def]
    with_loops = {f.signature.name for f in graph_def.library.function
                  if any(node.op in LOOPS for node in f.node_def)}
    calls = [node for node in nodes if node.op in ("PartitionedCall", "StatefulPartitionedCall")
             and node.attr["f"].func.name in with_loops]
    return sum(node.op in LOOPS for node in nodes), len(calls)


@pytest.mark.parametrize("batch", [0, 1, 2, 5])
def test_parallel_searches_give_each_sentence_its_single_search_result(module, batch,
                                                                      tiny_model_dir):
    # The default module splits a batch into 2 searches run at the same time (for a batch of
    # 1, one of them is empty); with 1 the batch is one search. Sentences of different
    # lengths, so the groups end at different steps; n_best = 2.
    proto = checkpoints.load_model(tiny_model_dir)[1]
    single = TranslationModule(module.model, proto, beam_size=3, alpha=0.6, n_best=2,
                               parallel_searches=1)
    assert module.parallel_searches == 2
    # Each has the loop over chunks, and in it one call per group of the one search function
    # (the graph holds its loop once).
    assert loops_and_loop_calls(single.serve_n_best) == (2, 1)
    assert loops_and_loop_calls(module.serve_n_best) == (2, 2)
    sentences = tf.constant((SENTENCES + ["Und Gott sah, dass es gut war, und es ward Abend."]
                             )[:batch], tf.string)
    expected, got = single.serve_n_best(sentences), module.serve_n_best(sentences)
    assert got["translations"].shape == (batch, 2)
    np.testing.assert_array_equal(got["translations"], expected["translations"])
    np.testing.assert_allclose(got["scores"], expected["scores"], rtol=1e-5)
    with pytest.raises(ValueError, match="parallel_searches"):
        TranslationModule(module.model, proto, parallel_searches=0)


def test_a_process_translating_from_an_export_gives_each_search_its_cores(exported, module):
    # The export records its searches; a command's process that loads it before TensorFlow
    # first runs shares the cores out (one op thread per core of each search). A fresh
    # process: TensorFlow sizes its pools once (the user's variables win: test_decoding_threads).
    from tfnmt.cpu_quota import usable_cores
    from tfnmt.inference.decoding_threads import export_searches

    assert export_searches(exported) == module.parallel_searches == 2
    script = ("import sys, tensorflow as tf; from tfnmt.inference import loading; "
              "f = loading.load_signatures(export=sys.argv[1]); "
              "print(f['serving_default'](['Guten Morgen!'])[0].numpy()[0].decode()); "
              "print(tf.config.threading.get_intra_op_parallelism_threads(), "
              "tf.config.threading.get_inter_op_parallelism_threads())")
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TF_NUM_")}
    cores = usable_cores()  # those it may run on, or fewer under a CPU limit (test_cpu_quota)
    gpu = any(glob.glob(pattern) for pattern in GPU_DEVICE_FILES)  # one search there
    expected = f"{max(1, cores // 2)} {cores}" if cores > 1 and not gpu else "0 0"
    translation = module.serve(tf.constant(["Guten Morgen!"]))["translations"][0].numpy()
    result = subprocess.run([sys.executable, "-c", script, exported], cwd=ROOT,
                            capture_output=True, timeout=300,
                            env=dict(environment, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.decode().splitlines() == [translation.decode(), expected]


@pytest.mark.parametrize("batch", [0, 1, 5])
def test_scores_are_those_of_one_group_whatever_the_groups(module, batch, tiny_model_dir):
    # `score` splits a chunk into parallel_searches groups, as the searches: each pair's score
    # is its score in one pass over the batch (up to rounding), also where a group is empty.
    proto = checkpoints.load_model(tiny_model_dir)[1]
    single = TranslationModule(module.model, proto, parallel_searches=1)
    three = TranslationModule(module.model, proto, parallel_searches=3)
    sources = (SENTENCES + ["Und Gott sah, dass es gut war."])[:batch]
    targets = ["In the beginning.", "God said: let there be light, and there was light.",
               "And God saw.", "", "It was good."][:batch]
    expected = single.score(tf.constant(sources, tf.string), tf.constant(targets, tf.string))
    for grouped in (module, three):
        assert loops_and_loop_calls(grouped.score) == (1, 0)
        got = grouped.score(tf.constant(sources, tf.string), tf.constant(targets, tf.string))
        assert got["scores"].shape == (batch,)
        np.testing.assert_array_equal(got["lengths"], expected["lengths"])
        np.testing.assert_allclose(got["scores"], expected["scores"], rtol=1e-5, atol=1e-5)
    # Two groups, two passes of the model: each calls the one function that holds it.
    graph_def = module.score.get_concrete_function().graph.as_graph_def()
    calls = [node.attr["f"].func.name for f in graph_def.library.function
             for node in f.node_def if node.op in ("PartitionedCall", "StatefulPartitionedCall")]
    assert len(calls) - len(set(calls)) >= 1


def test_parallel_searches_are_dealt_rows_of_every_length():
    # Group g of G gets the g-th, (g + G)-th, ... shortest rows (ties in row order), as many
    # as search_bounds gives it: against numpy's stable sort, for every size up to 9.
    rng = np.random.default_rng(0)
    for groups in (1, 2, 3, 4):
        for batch in range(10):
            lengths = rng.integers(1, 5, batch).astype(np.int32)  # ties
            order = dealt_order(tf.constant(lengths), groups).numpy()
            bounds = [int(b) for b in search_bounds(tf.constant(batch), groups, [])]
            ranked = np.argsort(lengths, kind="stable")
            for group in range(groups):
                assert order[bounds[group]:bounds[group + 1]].tolist() == \
                    ranked[group::groups].tolist()
            assert sorted(order.tolist()) == list(range(batch))
            sizes = np.diff(bounds)
            assert bounds[-1] == batch and sizes.max() - sizes.min() <= 1


def test_a_machine_with_a_gpu_searches_a_chunk_as_one_group(module, tiny_model_dir, tmp_path):
    # The device file is looked for when the graph runs, not when it is traced (an export is
    # made on one machine and served on another).
    device = tmp_path / "nvidia0"
    bounds = tf.function(lambda batch: tf.stack(search_bounds(batch, 3, [str(tmp_path / "nv*")])),
                         input_signature=[tf.TensorSpec([], tf.int32)], autograph=False)
    concrete = bounds.get_concrete_function()
    device.write_text("")
    assert concrete(tf.constant(7)).numpy().tolist() == [0, 7, 7, 7]
    assert [int(b) for b in search_bounds(tf.constant(7), 3, [str(tmp_path / "none*")])] == \
        [0, 3, 5, 7]
    assert [int(b) for b in search_bounds(tf.constant(7), 3, [])] == [0, 3, 5, 7]
    assert [int(b) for b in search_bounds(tf.constant(1), 3, [str(device)])] == [0, 1, 1, 1]
    # The same translations as on a CPU (two groups) and as one search.
    proto = checkpoints.load_model(tiny_model_dir)[1]
    on_gpu = TranslationModule(module.model, proto, beam_size=3, alpha=0.6, n_best=2,
                               gpu_files=[str(device)])
    sentences = tf.constant(SENTENCES)
    expected, got = module.serve_n_best(sentences), on_gpu.serve_n_best(sentences)
    np.testing.assert_array_equal(got["translations"], expected["translations"])
    np.testing.assert_allclose(got["scores"], expected["scores"], rtol=1e-5)


AMX_CPUINFO = ("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
               "bugs\t\t: spectre_v1\n")
AVX2_CPUINFO = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma avx512f avx512_vnni\n"


def test_auto_matmul_export_chooses_its_search_on_the_serving_machine(tiny_model_dir,
                                                                       tmp_path):
    # One export, two serving machines: the CPU flags are read where the export runs (here
    # from a file the test writes), not where it was made; each gives exactly the
    # translations of the same search run eagerly in that dtype. With a threshold of 0 the
    # timing on the first request always prefers bf16 where the flags say it is native
    # (the timing and the threshold are tested in test_serving_precision.py).
    model, proto, _ = checkpoints.load_model(tiny_model_dir)
    settings = dict(beam_size=3, alpha=0.6, n_best=2, parallel_searches=1)
    eager = {dtype: TranslationModule(model, proto, matmul_dtype=dtype, **settings)
             .translate_batch(tf.constant(SENTENCES), 1) for dtype in ("float32", "bfloat16")}
    # bf16 products: scores close to, not equal to, float32's (far enough apart for the
    # comparisons below to tell the two searches).
    float32_scores, bfloat16_scores = (eager[d][1][:, 0].numpy() for d in ("float32", "bfloat16"))
    np.testing.assert_allclose(bfloat16_scores, float32_scores, atol=0.5)
    assert np.abs(float32_scores - bfloat16_scores).max() > 1e-3
    cpuinfo = tmp_path / "cpuinfo"
    environ = tmp_path / "environ"  # without ONEDNN_MAX_CPU_ISA, whatever the suite runs under
    environ.write_bytes(b"PATH=/usr/bin\x00")
    module = TranslationModule(model, proto, matmul_dtype="auto", cpuinfo=str(cpuinfo),
                               environ=str(environ), bf16_min_speedup=0.0, **settings)
    path = export_saved_model(module, str(tmp_path / "export"), check=False)
    assert_each_weight_saved_once(path, model, extra=[np.array(-1, np.int32)],  # no choice yet
                                  matmul_dtypes=("bfloat16", "float32"))
    ops = graph_ops(path)
    assert not {op for op in ops if op not in set(dir(tf.raw_ops)) and op not in TF_TEXT_OPS}
    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    assert [node for function in saved.meta_graphs[0].graph_def.library.function
            for node in function.node_def
            if node.op == "MatMul" and node.attr["T"].type == tf.bfloat16.as_datatype_enum]
    feed = {"sentences": np.array([s.encode() for s in SENTENCES], object)}
    for text, dtype in ((AMX_CPUINFO, "bfloat16"), (AVX2_CPUINFO, "float32")):
        cpuinfo.write_text(text)
        with SessionModel(path) as served:  # TF Serving's loader
            loaded = served.run("serving_default", feed)
        translations, scores = eager[dtype]
        assert list(loaded["translations"]) == list(translations[:, 0].numpy()), dtype
        np.testing.assert_allclose(loaded["scores"], scores[:, 0], rtol=1e-5, err_msg=dtype)
    with pytest.raises(ValueError, match="matmul_dtype"):
        TranslationModule(model, proto, matmul_dtype="float16")


def test_export_command_matmul_dtype(tiny_model_dir, tmp_path):
    def export(*flags):
        # --check=false: the C++ loader check has its own tests; this one is about the flag.
        return python("export.py", f"--model_dir={tiny_model_dir}",
                      f"--export_dir={tmp_path / 'export'}", "--check=false", *flags)

    # auto (the default); one search per dtype
    result = export("--parallel_searches=1", "--no_repeat_ngram_size=3")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "length penalty 0.6 (the paper's)" in result.stdout  # no decoding.json there
    assert result.stdout.strip().endswith(
        f"export{os.sep}1 (weight matmuls: bfloat16 where the serving CPU times it faster, "
        "else float32; no translation repeats a sequence of 3 subwords)")
    # Both searches, and what chooses between them when the export runs: the file read, the
    # timing and the variable that keeps the choice.
    ops = graph_ops(str(tmp_path / "export" / "1"))
    assert {"ReadFile", "MatchingFiles", "Timestamp", "AssignVariableOp"} <= ops
    assert {"If", "StatelessIf"} & ops
    result = export("--matmul_dtype=float16")
    assert result.returncode != 0 and "matmul_dtype" in result.stderr
    assert os.listdir(tmp_path / "export") == ["1"]
    # A greedy export needs no --n_best: translate_n_best returns the beam's one hypothesis.
    result = export("--beam_size=1", "--matmul_dtype=float32", "--parallel_searches=1")
    assert result.returncode == 0, result.stderr[-3000:]
    import tensorflow_text  # noqa: F401  (the export's tokenizer ops)

    n_best = tf.saved_model.load(str(tmp_path / "export" / "2")).signatures["translate_n_best"]
    assert n_best.structured_outputs["translations"].shape.as_list() == [None, 1]
    # Its searches fit in the memory available where it is served: its graph reads the
    # kernel's figure and a container's limit (test_search_memory.py checks the readings).
    read = {os.path.join(search_memory.CGROUP, name)
            for name in itertools.chain(*search_memory.CGROUP_FILES)}
    assert {search_memory.MEMINFO, *read} <= graph_strings(str(tmp_path / "export" / "2"))
    asked = python("translate.py", f"--export={tmp_path / 'export'}", "--n_best=2",
                   input="Das Haus.\n")
    assert asked.returncode != 0 and asked.stdout == ""
    assert asked.stderr.strip().endswith(
        "the export gives 1 translation per sentence, fewer than --n_best=2 (export.py "
        "--n_best sets how many, up to its --beam_size)")
    result = export("--beam_size=2", "--n_best=3")
    assert result.returncode != 0 and "--n_best must be in [1, --beam_size=2]" in result.stderr
    assert sorted(os.listdir(tmp_path / "export")) == ["1", "2"]


@pytest.mark.parametrize("onednn", [None, "0"])
def test_bf16_export_under_an_isa_cap_is_refused_only_where_it_would_abort(tiny_model_dir,
                                                                          tmp_path, onednn):
    # Under ONEDNN_MAX_CPU_ISA=AVX2 with oneDNN on, a CPU with AVX-512 aborts on a bfloat16
    # product (oneDNN has no kernel for it): the check cannot run there, and export.py says so
    # in one line. Elsewhere (no AVX-512, or Eigen's kernels) the same command exports and
    # checks as usual.
    from tfnmt import cpu_kernels

    env = dict(cpu_kernels.user_environment(), TF_CPP_MIN_LOG_LEVEL="2",
               ONEDNN_MAX_CPU_ISA="AVX2")
    env.pop("TF_ENABLE_ONEDNN_OPTS", None)
    if onednn is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = onednn
    result = subprocess.run([sys.executable, "export.py", f"--model_dir={tiny_model_dir}",
                             f"--export_dir={tmp_path / 'export'}", "--matmul_dtype=bfloat16",
                             "--parallel_searches=1"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300, env=env)
    if cpu_kernels.bf16_abort_reason(env):
        assert result.returncode == 1, result.stderr[-3000:]
        assert result.stderr.strip().splitlines()[-1].startswith(
            "export.py: --matmul_dtype=bfloat16: the check would run it here, but oneDNN "
            "capped at ONEDNN_MAX_CPU_ISA=AVX2 has no bfloat16 kernels")
        assert not os.path.exists(tmp_path / "export" / "1")
    else:
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.strip().endswith("(weight matmuls: bfloat16)")


def test_another_tools_saved_model_is_named_as_such(tmp_path):
    # translate.py/evaluate.py --export= a SavedModel export.py did not write (another
    # toolkit's, a Keras model's) ended in a traceback from the signature's arguments.
    from tfnmt.inference import loading
    from tfnmt.paths import DamagedFileError

    class Doubler(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def double(self, x):
            return {"y": 2 * x}

    module = Doubler()
    tf.saved_model.save(module, str(tmp_path / "signed" / "1"),
                        signatures={"serving_default": module.double})
    tf.saved_model.save(module, str(tmp_path / "unsigned" / "1"), signatures={})
    for name, found in (("signed", "has a serving_default signature of x \\(float32\\) to y"),
                        ("unsigned", "has no serving_default signature")):
        with pytest.raises(DamagedFileError, match=f"{name}/1 is not a translation export of "
                           f"export.py: it {found}, where export.py's takes sentences \\(string\\)"
                           " to translations and scores"):
            loading.load_signatures(export=str(tmp_path / name))
