import gc
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import pytest  # noqa: E402

from tfnmt import allocator, cli  # noqa: E402

# Keras' optional imports left out, as the entry points leave them out: the workers import
# what a program imports, ~0.75 s sooner each.
cli.leave_out_optional_imports()

# The suite's own process gets the entry points' glibc tuning (tfnmt/allocator.py).
allocator.tune_glibc()

import tensorflow as tf  # noqa: E402


def pytest_unconfigure(config):
    # As the entry points (tfnmt/cli.py): each worker's interpreter teardown would otherwise
    # collect every object the suite's traced graphs left (about 2 s a worker).
    gc.freeze()


# Seeded once: tf.random.set_seed clears TensorFlow's eager kernel cache, which deletes the
# SentencePiece resources of tokenizers that module-scoped fixtures hold.
tf.random.set_seed(0)


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory):
    """3,000 training / 200 dev pairs of the embedded corpus as local TSV files."""
    import gzip

    from tfnmt.paths import EMBEDDED_DIR

    root = tmp_path_factory.mktemp("small_corpus")
    for split, count in (("train", 3000), ("dev", 200)):
        with gzip.open(os.path.join(EMBEDDED_DIR, f"{split}.tsv.gz"), "rt") as f:
            lines = [next(f) for _ in range(count)]
        (root / f"{split}.tsv").write_text("".join(lines), encoding="utf-8")
    return {"train": str(root / "train.tsv"), "dev": str(root / "dev.tsv")}


@pytest.fixture(scope="session")
def small_prepared(small_corpus, tmp_path_factory):
    """The small corpus tokenized (600-piece vocabulary) into 4 train shards."""
    from tfnmt.data import records

    out = str(tmp_path_factory.mktemp("prepared_small"))
    records.prepare(out, dataset="files", files=small_corpus, vocab_size=600, train_shards=4)
    return out


@pytest.fixture(scope="session")
def separate_prepared(small_corpus, tmp_path_factory):
    """The small corpus with separate vocabularies (500 pieces each side) in 2 train shards."""
    from tfnmt.data import records

    out = str(tmp_path_factory.mktemp("prepared_separate"))
    records.prepare(out, dataset="files", files=small_corpus, vocab_size=500, train_shards=2,
                    separate=True)
    return out


@pytest.fixture(scope="session")
def train_data(small_corpus, tmp_path_factory):
    """Prepared data for train.py runs on the small corpus (train.py finds it up to date)."""
    from tfnmt.data import records

    out = str(tmp_path_factory.mktemp("train_data"))
    records.prepare(out, dataset="files", files=small_corpus, vocab_size=600)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(small_prepared, tmp_path_factory):
    """A model_dir as train.py leaves it (settings.json, spm.model, a checkpoint) holding an
    untrained tiny model over the small corpus' 600-piece vocabulary."""
    import json
    import shutil

    import keras

    from tfnmt.model.presets import get_preset
    from tfnmt.model.transformer import Transformer

    model_dir = tmp_path_factory.mktemp("tiny_model_dir")
    settings = {"model": dict(get_preset("tiny", dropout=0.0), vocab_size=600, max_length=64)}
    (model_dir / "settings.json").write_text(json.dumps(settings))
    shutil.copyfile(os.path.join(small_prepared, "spm.model"), model_dir / "spm.model")
    keras.utils.set_random_seed(7)
    model = Transformer(**settings["model"])
    model.build()
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model),
                                         str(model_dir / "checkpoints"), max_to_keep=1,
                                         checkpoint_name="ckpt")
    manager.save(checkpoint_number=1)
    return str(model_dir)
