import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    tf.random.set_seed(0)
    yield


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory):
    """3,000 training / 200 dev pairs of the embedded corpus as local TSV files."""
    import gzip

    from tfnmt.corpus import EMBEDDED_DIR

    root = tmp_path_factory.mktemp("small_corpus")
    for split, count in (("train", 3000), ("dev", 200)):
        with gzip.open(os.path.join(EMBEDDED_DIR, f"{split}.tsv.gz"), "rt") as f:
            lines = [next(f) for _ in range(count)]
        (root / f"{split}.tsv").write_text("".join(lines), encoding="utf-8")
    return {"train": str(root / "train.tsv"), "dev": str(root / "dev.tsv")}


@pytest.fixture(scope="session")
def small_prepared(small_corpus, tmp_path_factory):
    """The small corpus tokenized (600-piece vocabulary) into 4 train shards."""
    from tfnmt import records

    out = str(tmp_path_factory.mktemp("prepared_small"))
    records.prepare(out, dataset="files", files=small_corpus, vocab_size=600, train_shards=4)
    return out


@pytest.fixture(scope="session")
def embedded_prepared(tmp_path_factory):
    """The whole embedded corpus with the default 8,000-piece vocabulary (~25 s)."""
    from tfnmt import records

    out = str(tmp_path_factory.mktemp("prepared_embedded"))
    records.prepare(out, tfds_data_dir=str(tmp_path_factory.mktemp("tfds")))
    return out
