"""Decoding speed from exported SavedModels, as TF Serving would run them, in one run.

Exports the training directory's checkpoint with export.py into a scratch directory (removed
at exit): beam 4 and greedy (beam 1), each with the --matmul_dtypes given: float32, bfloat16
(the weight matmuls in bf16, all else float32) and auto (export.py's default, which searches
in bfloat16 where the serving CPU times it faster; not checked against the eager search). Loads each
SavedModel the way a server does (tensorflow + tensorflow_text only) and times its
serving_default signature on a split at each batch size: sentences/s and target tokens/s, where
target tokens are SentencePiece pieces of the outputs (as OpenNMT-tf counts them), plus the
sacreBLEU of the full split's translations, and the beam exports' `score` signature (forced
decoding of each sentence's reference, pairs/s). Sentences are batched by length, as translate.py
does; one batch is decoded first as warm-up, then --rounds timed passes, of which the median is
reported (and each pass's tokens/s). Also prints the RSS with the exports loaded, and checks
each exported beam search against the plain eager one (same checkpoint and dtype, no
tf.function) on the first --check sentences. The exports search with the GNMT length penalty
--alpha (0.6), not the one train.py chose for the model_dir.
With --ctranslate2 it also converts the same checkpoint with export.py --format=ctranslate2
(float32 and/or int8 weights) and times CTranslate2's translate_batch the same way (beam 4,
CTranslate2's own length penalty 0.6, --ct2_threads threads for one translator), so both engines
decode the same model on the same sentences. Each CTranslate2 run is a fresh process per
--ct2_gemm backend: CTranslate2 picks Intel MKL on Intel CPUs, whose products can run several
times slower than its oneDNN ones (CT2_USE_MKL=0); the JSON names the SGEMM backend each used.
--session_threads sizes the exports' thread pools as TF Serving's flags do: at 32 sentences
per call on 2 cores, 1:2 (one thread per op, the export's parallel searches side by side)
decodes faster than TensorFlow's default (bench/README.md, "Decoding").
Batch 1 is also timed with --clients clients sending one-sentence requests at once, as a
server receives them (`*_batch1_clients<N>`): an export's session runs them side by side on
its inter-op threads, CTranslate2 with one translator thread per client.
Prints one JSON line.

  python bench/decode.py                       # after `python train.py` (runs/de-en)
  python bench/decode.py --batch_sizes=32 --limit=256 --matmul_dtypes=bfloat16
"""
import atexit
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from common import (KERNELS, MALLOC, ROOT, cpu_description, define_session_threads_flag,
                    peak_rss_bytes, rss_bytes, session_threads)
from tfnmt import paths  # noqa: E402

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", "runs/de-en", "Training directory to export and time.")
flags.DEFINE_enum("split", "test", ["dev", "test"], "Split to decode.")
flags.DEFINE_list("batch_sizes", ["32", "1"], "Sentences per call, each timed.")
flags.DEFINE_integer("limit", 0, "Decode only the first N sentences (0: all).")
flags.DEFINE_integer("batch1_limit", 300, "Sentences decoded at batch size 1 (0: all).")
MATMUL_DTYPES = ("float32", "bfloat16", "auto")
flags.DEFINE_list("matmul_dtypes", ["float32", "bfloat16"], "export.py --matmul_dtype values "
                  "timed, each for beam 4 and greedy: float32, bfloat16 (only worth it with "
                  "native bf16), auto (export.py's default: the server picks one).")
flags.register_validator("matmul_dtypes", lambda v: set(v) <= set(MATMUL_DTYPES),
                         f"--matmul_dtypes takes {', '.join(MATMUL_DTYPES)}")
flags.DEFINE_integer("check", 64, "Sentences compared with eager beam search (0: skip).")
flags.DEFINE_integer("rounds", 3, "Timed passes over the sentences per export and batch size; "
                     "the median is reported (single passes here vary by up to 13%).")
flags.register_validator("rounds", lambda v: v >= 1, "--rounds must be >= 1")
flags.DEFINE_enum("loader", "session", ["session", "python"], "How the exports are loaded: "
                  "'session', TensorFlow's C++ loader as TF Serving loads them "
                  "(tfnmt/inference/session_loader.py); 'python', tf.saved_model.load.")
flags.DEFINE_list("ctranslate2", ["float32", "int8"], "CTranslate2 weight types also timed "
                  "(export.py --format=ctranslate2; empty: none).")
flags.DEFINE_integer("ct2_threads", 0, "CTranslate2 intra-op threads (0: one per core).")
flags.DEFINE_integer("clients", 2, "Batch 1 is also timed with this many clients sending "
                     "one-sentence requests at once, as a server receives them (below 2: not); "
                     "CTranslate2 then has one translator thread per client, cores // clients "
                     "threads each.")
CT2_GEMMS = {"auto": {}, "dnnl": {"CT2_USE_MKL": "0"}}
flags.DEFINE_list("ct2_gemm", ["auto", "dnnl"], "CTranslate2 GEMM backends timed, each in its "
                  "own process: auto (CTranslate2's choice, MKL on Intel CPUs), dnnl "
                  "(CT2_USE_MKL=0; skipped where auto already picks oneDNN).")
flags.register_validator("ct2_gemm", lambda v: set(v) <= set(CT2_GEMMS),
                         f"--ct2_gemm takes {', '.join(CT2_GEMMS)}")
flags.DEFINE_string("ct2_model", None, "Internal: time only this CTranslate2 model directory "
                    "as --ctranslate2 does and print its JSON (the child process of one run).")
define_session_threads_flag()
flags.DEFINE_float("alpha", 0.6, "GNMT length penalty of the exports and of the eager search "
                   "they are checked against (not the model_dir's decoding.json, so that every "
                   "engine decodes with 0.6).")
flags.DEFINE_integer("parallel_searches", 2, "export.py's --parallel_searches (1: a batch is "
                     "one search).")


def export(model_dir, export_dir, beam_size, matmul_dtype):
    subprocess.run([sys.executable, os.path.join(ROOT, "export.py"), f"--model_dir={model_dir}",
                    f"--export_dir={export_dir}", f"--beam_size={beam_size}", "--n_best=1",
                    f"--alpha={FLAGS.alpha}",
                    f"--matmul_dtype={matmul_dtype}",
                    f"--parallel_searches={FLAGS.parallel_searches}"],
                   check=True, stdout=subprocess.DEVNULL)
    return os.path.join(export_dir, "1")


def main(argv):
    del argv
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the SentencePiece ops, as a server has them)

    # Before any op runs: the sessions' CPU devices share the process's thread pools, which
    # the first use of TensorFlow sizes (a TF Serving process runs sessions only).
    intra, inter = session_threads()
    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)

    from tfnmt.data.corpus import read_split
    from tfnmt.data.tokenizer import Tokenizer

    with open(os.path.join(FLAGS.model_dir, paths.SETTINGS)) as f:
        settings = json.load(f)
    data, max_length = settings["data"], settings["model"]["max_length"]
    pairs = list(read_split(data, FLAGS.split))
    pairs = pairs[:FLAGS.limit] if FLAGS.limit else pairs
    sources, references = [s for s, _ in pairs], [r for _, r in pairs]
    tokenizer = Tokenizer(os.path.join(FLAGS.model_dir, paths.VOCAB))
    if FLAGS.ct2_model:
        result = {}
        cores = len(os.sched_getaffinity(0))
        concurrent = (load_ctranslate2(FLAGS.ct2_model, max_length, FLAGS.clients,
                                       max(1, cores // FLAGS.clients))
                      if FLAGS.clients > 1 else None)  # --clients below 2: not timed
        time_translator(result, "ctranslate2", load_ctranslate2(FLAGS.ct2_model, max_length),
                        sources, references, tokenizer, concurrent)
        print(json.dumps(result))
        return
    result = {"machine": cpu_description(), "malloc": MALLOC, "kernels": KERNELS,
              "model_dir": FLAGS.model_dir, "split": FLAGS.split, "loader": FLAGS.loader,
              "alpha": FLAGS.alpha, "session_threads": FLAGS.session_threads,
              "rss_gib_before_loading": round(rss_bytes() / 2 ** 30, 2)}
    scratch = tempfile.mkdtemp(prefix="tfnmt-bench-")
    atexit.register(shutil.rmtree, scratch, True)  # ~160 MB of exports a run
    beam_translators = {}  # matmul dtype -> the export's translate function
    for name, beam_size, matmul_dtype in (("beam4", 4, "float32"), ("greedy", 1, "float32"),
                                          ("beam4_bf16", 4, "bfloat16"),
                                          ("greedy_bf16", 1, "bfloat16"),
                                          ("beam4_auto", 4, "auto"), ("greedy_auto", 1, "auto")):
        if matmul_dtype not in FLAGS.matmul_dtypes:
            continue
        translate, score = load_translate(export(FLAGS.model_dir, os.path.join(scratch, name),
                                                 beam_size, matmul_dtype))

        time_translator(result, name, translate, sources, references, tokenizer)
        if beam_size == 4:  # the `score` signature, the same in every export of a dtype
            time_scoring(result, f"score_{matmul_dtype}", score, sources, references)
        if beam_size == 4 and matmul_dtype != "auto":  # auto: the eager dtype is the server's
            beam_translators[matmul_dtype] = translate
    for weights in FLAGS.ctranslate2:
        path = export_ctranslate2(FLAGS.model_dir, os.path.join(scratch, f"ct2_{weights}"),
                                  weights)
        backends = {}  # --ct2_gemm -> the SGEMM backend CTranslate2 chose
        for gemm in FLAGS.ct2_gemm:
            if gemm != "auto" and backends.get("auto") == "DNNL":
                continue  # the same kernels again
            timed, backends[gemm] = time_ctranslate2(path, gemm)
            suffix = "" if gemm == "auto" else f"_{gemm}"
            result.update({key.replace("ctranslate2", f"ctranslate2_{weights}{suffix}_beam4"):
                           value for key, value in timed.items()})
        result[f"ctranslate2_{weights}_sgemm_backend"] = backends
    result["rss_gib_exports_loaded"] = round(rss_bytes() / 2 ** 30, 2)
    result["peak_rss_gib"] = round(peak_rss_bytes() / 2 ** 30, 2)
    if FLAGS.check:
        for matmul_dtype, translate in beam_translators.items():
            result[f"same_as_eager_beam_search_{matmul_dtype}"] = same_as_eager(
                sources[:FLAGS.check], translate, matmul_dtype)
    print(json.dumps(result))


def time_translator(result, name, translate, sources, references, tokenizer,
                    concurrent_translate=None):
    """Times `translate` at each batch size into result[f"{name}_batch{size}"], and at batch 1
    with --clients clients at once (through `concurrent_translate`, default `translate`) into
    result[f"{name}_batch1_clients{clients}"]."""
    import tensorflow as tf

    from tfnmt.inference.batching import translate_lines
    from tfnmt.inference.sacrebleu_scores import corpus_scores

    batch_sizes = list(map(int, FLAGS.batch_sizes))
    batch1_lines = sources[:FLAGS.batch1_limit] if FLAGS.batch1_limit else sources
    if 1 in batch_sizes and FLAGS.clients > 1:
        result[f"{name}_batch1_clients{FLAGS.clients}"] = time_clients(
            concurrent_translate or translate, batch1_lines, tokenizer)
    for batch_size in batch_sizes:
        lines = batch1_lines if batch_size == 1 else sources
        translate_lines(translate, lines[:batch_size], batch_size)  # warm-up
        times = []
        for _ in range(FLAGS.rounds):
            start = time.perf_counter()
            outputs = translate_lines(translate, lines, batch_size)
            times.append(time.perf_counter() - start)
        elapsed = statistics.median(times)
        pieces = int(tf.reduce_sum(tokenizer.tokenize(outputs).row_lengths()))
        result[f"{name}_batch{batch_size}"] = {
            "sentences": len(lines), "seconds": round(elapsed, 1),
            "sentences_per_s": round(len(lines) / elapsed, 2),
            "target_tokens_per_s": round(pieces / elapsed, 1),
            "target_tokens_per_s_each_round": [round(pieces / t, 1) for t in times]}
        if len(lines) == len(sources):
            result[f"{name}_batch{batch_size}"]["sacrebleu"] = round(
                corpus_scores(outputs, references)["bleu"], 2)


def time_clients(translate, lines, tokenizer):
    """Times --clients threads that each translate their share of `lines` (every clients-th
    line) one sentence per call, all at once: sentences/s and target tokens/s of the median of
    --rounds passes."""
    import threading

    import tensorflow as tf

    outputs = [None] * len(lines)

    def client(first):
        for index in range(first, len(lines), FLAGS.clients):
            outputs[index] = translate([lines[index]])[0].numpy()[0].decode("utf-8")

    translate(lines[:1])  # warm-up
    times = []
    for _ in range(FLAGS.rounds):
        threads = [threading.Thread(target=client, args=(first,))
                   for first in range(FLAGS.clients)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        times.append(time.perf_counter() - start)
    elapsed = statistics.median(times)
    pieces = int(tf.reduce_sum(tokenizer.tokenize(outputs).row_lengths()))
    return {"sentences": len(lines), "clients": FLAGS.clients, "seconds": round(elapsed, 1),
            "sentences_per_s": round(len(lines) / elapsed, 2),
            "target_tokens_per_s": round(pieces / elapsed, 1)}


def time_scoring(result, name, score, sources, references):
    """Times `score` (the export's forced decoding of (source, reference) pairs, in batches of
    similar source length) at each batch size into result[f"{name}_batch{size}"]."""
    for batch_size in map(int, FLAGS.batch_sizes):
        count = FLAGS.batch1_limit if batch_size == 1 and FLAGS.batch1_limit else len(sources)
        pairs = sorted(zip(sources[:count], references[:count]), key=lambda p: len(p[0]))
        batches = [pairs[i:i + batch_size] for i in range(0, len(pairs), batch_size)]
        score(batches[0])  # warm-up
        times = []
        for _ in range(FLAGS.rounds):
            start = time.perf_counter()
            for batch in batches:
                score(batch)
            times.append(time.perf_counter() - start)
        result[f"{name}_batch{batch_size}"] = {
            "pairs": len(pairs), "pairs_per_s": round(len(pairs) / statistics.median(times), 2)}


def export_ctranslate2(model_dir, export_dir, weights):
    quantization = "none" if weights == "float32" else weights
    subprocess.run([sys.executable, os.path.join(ROOT, "export.py"), f"--model_dir={model_dir}",
                    "--format=ctranslate2", f"--export_dir={export_dir}",
                    f"--quantization={quantization}", "--alpha=0.6"],  # as timed below
                   check=True, stdout=subprocess.DEVNULL)
    return export_dir


def time_ctranslate2(path, gemm):
    """Times the CTranslate2 model at `path` in a child process with --ct2_gemm's environment:
    (its `time_translator` entries, keyed "ctranslate2_batch<size>"; the SGEMM backend
    CTranslate2 logged, e.g. "MKL" or "DNNL")."""
    args = [FLAGS[name].serialize() for name in ("model_dir", "split", "batch_sizes", "limit",
                                                 "batch1_limit", "rounds", "ct2_threads",
                                                 "clients")]
    child = subprocess.run([sys.executable, os.path.abspath(__file__), f"--ct2_model={path}",
                            *args], env=dict(os.environ, CT2_VERBOSE="1", **CT2_GEMMS[gemm]),
                           capture_output=True, text=True)
    if child.returncode != 0:
        sys.exit(f"CTranslate2 ({gemm}) failed:\n{child.stderr[-3000:]}")
    backend = re.search(r"SGEMM backend: (\w+)", child.stderr)
    return json.loads(child.stdout.strip().splitlines()[-1]), backend and backend.group(1)


def load_ctranslate2(path, max_length, inter_threads=1, intra_threads=None):
    """A CTranslate2 model directory as str [B] -> (translations tensor [B], scores [B]), within
    the model's `max_length` positions (a longer source truncated, as the SavedModel does); its
    translator runs `inter_threads` calls at once, each on `intra_threads` threads
    (default --ct2_threads)."""
    import ctranslate2
    import sentencepiece
    import tensorflow as tf

    processor = sentencepiece.SentencePieceProcessor(model_file=os.path.join(path, paths.VOCAB))
    translator = ctranslate2.Translator(
        path, device="cpu", inter_threads=inter_threads,
        intra_threads=FLAGS.ct2_threads if intra_threads is None else intra_threads)

    def translate(sentences):
        results = translator.translate_batch(
            [processor.encode(s, out_type=str) for s in sentences], beam_size=4,
            length_penalty=0.6, max_batch_size=len(sentences), return_scores=True,
            max_input_length=max_length, max_decoding_length=max_length)
        translations = [processor.decode(r.hypotheses[0]) for r in results]
        return tf.constant(translations, tf.string), [r.scores[0] for r in results]
    return translate


def load_translate(path):
    """The export, loaded by --loader, as (translate: its serving_default, str [B] ->
    (translations tensor [B], scores [B]); score: its `score` signature, [(source, target)]
    -> log-probabilities [B])."""
    import numpy as np
    import tensorflow as tf

    if FLAGS.loader == "session":
        from tfnmt.inference.session_loader import SessionModel

        intra, inter = session_threads()
        served = SessionModel(path, intra_threads=intra, inter_threads=inter)

        def strings(texts):
            return np.array([text.encode() for text in texts], object)

        def translate(sentences):
            out = served.run("serving_default", {"sentences": strings(sentences)})
            return tf.constant(out["translations"].tolist(), tf.string), out["scores"]

        def score(pairs):
            return served.run("score", {"sentences": strings([s for s, _ in pairs]),
                                        "targets": strings([t for _, t in pairs])})["scores"]
        return translate, score
    signatures = tf.saved_model.load(path).signatures

    def translate(sentences):
        out = signatures["serving_default"](sentences=tf.constant(sentences, tf.string))
        return out["translations"], out["scores"]

    def score(pairs):
        return signatures["score"](sentences=tf.constant([s for s, _ in pairs], tf.string),
                                   targets=tf.constant([t for _, t in pairs], tf.string))["scores"]
    return translate, score


def same_as_eager(sources, translate_exported, matmul_dtype):
    """Share of `sources` whose exported translation equals eager beam search's (batch 32, each
    batch split into the export's searches: bf16 products round differently with a search's
    number of rows)."""
    import tensorflow as tf

    from tfnmt.checkpoints import load_model
    from tfnmt.inference.batching import translate_lines
    from tfnmt.inference.serving import TranslationModule

    model, proto, _ = load_model(FLAGS.model_dir)
    module = TranslationModule(model, proto, beam_size=4, alpha=FLAGS.alpha, n_best=1,
                               parallel_searches=FLAGS.parallel_searches,
                               matmul_dtype=matmul_dtype)

    def eager(sentences):  # translate_batch itself, not the tf.function around it
        translations, scores = module.translate_batch(tf.constant(sentences, tf.string), 1)
        return translations[:, 0], scores[:, 0]

    plain = translate_lines(eager, sources, 32)
    exported = translate_lines(translate_exported, sources, 32)
    return round(sum(a == b for a, b in zip(plain, exported)) / max(len(sources), 1), 4)


if __name__ == "__main__":
    app.run(main)
