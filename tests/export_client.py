"""Run as a subprocess: load an export as servers do and print, as one JSON line, each
signature's outputs for the sentences given as JSON on stdin, from

- "session": TensorFlow's C++ loader (LoadSavedModel + Session::Run through the C API), the
  route TF Serving takes;
- "python": `tf.saved_model.load`, the object-graph loader Python clients use;

and "rank_2_error": what the C++ loader's serving_default says to a [2, 2] input; "score":
the `score` signature on each sentence with serving_default's translation as its target, from
both loaders; "prefix": translate_with_prefix through the C++ loader. Imports
tensorflow, tensorflow_text and tfnmt.inference.session_loader (ctypes over the C API) only:
nothing of tfnmt's model or serving code."""
import gc
import json
import sys

import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  registers the SentencePiece ops the graph uses

from tfnmt.inference.session_loader import SessionLoaderError, SessionModel

SIGNATURES = ("serving_default", "translate_n_best")


def as_lists(outputs):
    return {"translations": [t.decode("utf-8") for t in np.ravel(outputs["translations"])],
            "scores": np.ravel(outputs["scores"]).tolist(),
            "shape": list(np.shape(outputs["translations"]))}


def main():
    path = sys.argv[1]
    sentences = json.load(sys.stdin)
    result = {}
    with SessionModel(path) as served:
        feed = {"sentences": np.array([s.encode("utf-8") for s in sentences], object)}
        result["session"] = {name: as_lists(served.run(name, feed)) for name in SIGNATURES}
        try:
            served.run("serving_default", {"sentences": np.array([[b"a", b"b"], [b"c", b"d"]],
                                                                 object)})
            result["rank_2_error"] = None
        except SessionLoaderError as error:
            result["rank_2_error"] = str(error)
        targets = result["session"]["serving_default"]["translations"]
        scored = served.run("score", dict(feed, targets=np.array(
            [t.encode("utf-8") for t in targets], object)))
        result["score"] = {"targets": targets, "session": {
            k: np.ravel(v).tolist() for k, v in scored.items()}}
        prefixes = [("That is", "", "Good")[i % 3] for i in range(len(sentences))]
        prefixed = served.run("translate_with_prefix", dict(feed, prefixes=np.array(
            [p.encode("utf-8") for p in prefixes], object)))
        result["prefix"] = {"prefixes": prefixes, "session": as_lists(prefixed)}
    loaded = tf.saved_model.load(path)
    result["python"] = {
        name: as_lists({k: v.numpy() for k, v in loaded.signatures[name](
            sentences=tf.constant(sentences, tf.string)).items()})
        for name in SIGNATURES}
    result["score"]["python"] = {k: v.numpy().tolist() for k, v in loaded.signatures["score"](
        sentences=tf.constant(sentences), targets=tf.constant(targets)).items()}
    result["tfnmt_modules"] = sorted(m for m in sys.modules if m.startswith("tfnmt"))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
    # As the entry points (tfnmt/cli.py): the interpreter's teardown then skips collecting
    # the objects of every graph it loaded.
    gc.freeze()
