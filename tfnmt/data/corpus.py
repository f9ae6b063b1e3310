"""Raw parallel text: the embedded corpus, TFDS translation datasets, or local files.

Every reader yields (source, target) string pairs. Local files are checked line by line: invalid
UTF-8, a missing tab, or files of different lengths raise `CorpusError` naming file and line.
Pairs with an empty side are skipped and counted (documented behaviour: they carry no signal).
A UTF-8 byte order mark at a file's start is dropped.
"""
import gzip
import hashlib
import itertools
import logging
import os
import socket
import stat
import tempfile
import zlib

from tfnmt.data.alignment import AlignmentWatch, describe
from tfnmt.paths import EMBEDDED_DIR, cannot_write_in
from tfnmt.text_lines import head, wide_encoding_message

EMBEDDED = "embedded"
EMBEDDED_TFDS_NAME = "tfnmt_de_en"
SPLITS = ("train", "dev", "test")

# (dataset, split, files, reverse) whose skipped pairs this process has logged: a run reads its
# dev split at each evaluation and for the length penalty, and one line says it.
_logged_skips = set()
# TSV files whose lines with more columns than their first this process has logged (the same).
_logged_columns = set()


def sha256_file(path):
    """The sha256 of a file's bytes (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _sha256_if_readable(path):
    """`sha256_file`, or None for a path that is gone or cannot be read (reading the text
    then says what is wrong with it)."""
    try:
        return sha256_file(path)
    except OSError:
        return None


def input_fingerprint(dataset, files=None, tfds_data_dir=None):
    """What the raw text is, so that a changed input makes `prepare` rebuild.

    Args:
      dataset, files, tfds_data_dir: as for `read_corpus`.

    Returns:
      A JSON-able dict: checksums of the embedded or user files, or the TFDS name and directory.
    """
    if dataset == EMBEDDED:
        tsv_paths = [os.path.join(EMBEDDED_DIR, f"{s}.tsv.gz") for s in SPLITS]
        return {"embedded": {os.path.basename(p): sha256_file(p) for p in tsv_paths}}
    if dataset == "files":  # a split's spec: "a.tsv", "a.de,a.en", or a list of such (train)
        return {"files": {split: {p: _sha256_if_readable(p)
                                  for spec in train_specs({"train": specs})
                                  for p in (spec or "").split(",") if p}
                          for split, specs in sorted((files or {}).items())}}
    return {"tfds": dataset, "tfds_data_dir": tfds_data_dir}


class CorpusError(ValueError):
    """Bad or missing input text, with the file and line when there is one."""


def _open_text(path):
    if not os.path.exists(path):
        raise CorpusError(f"{path}: file not found")
    # Bytes, decoded per line below, so an error can name the line.
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _reason(error):
    return getattr(error, "strerror", None) or str(error)


def _raw_lines(path):
    """The lines of a file (plain or .gz) as bytes; a .gz that turns out damaged part way (a
    truncated download, a bad block) is a CorpusError naming the file and the last good line,
    not a traceback."""
    number = 0
    with _open_text(path) as f:
        try:
            # The first bytes, not the first line: that of a UTF-16LE file may be an empty one.
            if message := wide_encoding_message(path, head(f)):
                raise CorpusError(message)
            for number, raw in enumerate(f, 1):
                yield raw
        except (EOFError, OSError, zlib.error) as error:
            raise CorpusError(f"{path}: unreadable after line {number:,d} "
                              f"({_reason(error)})") from None


def _decode(raw, path, number):
    """Line `number` of `path` as text; on the first line a UTF-8 byte order mark (which
    Windows editors write) is dropped, not made part of the first sentence."""
    start = 3 if number == 1 and raw.startswith(b"\xef\xbb\xbf") else 0
    try:
        return raw[start:].decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as error:
        raise CorpusError(f"{path}:{number}: invalid UTF-8 ({error.reason} at byte "
                          f"{error.start + start})") from None


def read_tsv(path, columns=2):
    """Reads pairs from a TSV file (plain or .gz).

    Args:
      path: the file; its first two tab-separated columns are source and target.
      columns: the fewest columns a line may have.

    Yields:
      (source, target) strings.

    Logs (once per process and file) how many lines have more columns than the first.

    Raises:
      CorpusError: a line with too few columns or not UTF-8 (naming the file and line).
    """
    first_columns, wider, first_wider = None, 0, None
    for number, raw in enumerate(_raw_lines(path), 1):
        fields = _decode(raw, path, number).split("\t")
        if len(fields) < columns:
            raise CorpusError(f"{path}:{number}: expected {columns} tab-separated columns, "
                              f"found {len(fields)}")
        first_columns = first_columns or len(fields)
        if len(fields) > first_columns:  # a tab inside a sentence shifts the columns after it
            wider += 1
            first_wider = first_wider or number
        yield fields[0], fields[1]
    if wider and path not in _logged_columns:
        _logged_columns.add(path)
        logging.warning("%s: %d line%s more tab-separated columns than line 1 (%d), the first "
                        "at line %d; a pair is read from a line's first two columns, so a tab "
                        "inside a sentence cuts it there",
                        path, wider, " has" if wider == 1 else "s have", first_columns,
                        first_wider)


def tsv_rows(path, count):
    """The first `count` lines of a TSV file (plain or .gz), each split at its tabs.

    Raises:
      CorpusError: as `read_tsv`.
    """
    return [_decode(raw, path, number).split("\t")
            for number, raw in zip(range(1, count + 1), _raw_lines(path))]


def read_aligned(source_path, target_path):
    """Reads pairs from two line-aligned files (plain or .gz).

    Args:
      source_path, target_path: one sentence per line each.

    Yields:
      (source, target) strings.

    Raises:
      CorpusError: the files end at different lines, their lines look out of step
        (`alignment.AlignmentWatch`), or a line is not UTF-8.
    """
    lines = itertools.zip_longest(_raw_lines(source_path), _raw_lines(target_path))
    watch = AlignmentWatch()
    for number, (src, tgt) in enumerate(lines, 1):
        if src is None or tgt is None:
            shorter = source_path if src is None else target_path
            raise CorpusError(f"{shorter}: ends at line {number - 1}, but "
                              f"{target_path if src is None else source_path} goes on: "
                              "the files are not line-aligned")
        source, target = _decode(src, source_path, number), _decode(tgt, target_path, number)
        if found := watch.add(number, source, target):
            raise CorpusError(_out_of_step(source_path, target_path, found))
        yield source, target
    if found := watch.finish():
        raise CorpusError(_out_of_step(source_path, target_path, found))


def _out_of_step(source_path, target_path, found):
    return f"{source_path},{target_path}: {describe(found)}"


def read_files(paths):
    """Reads pairs from user files.

    Args:
      paths: one TSV path, "source_path,target_path", or a list of one or two paths.

    Returns:
      An iterator of (source, target) strings.
    """
    if isinstance(paths, str):
        paths = [p for p in paths.split(",") if p]
    if len(paths) == 1:
        return read_tsv(paths[0])
    if len(paths) == 2:
        return read_aligned(*paths)
    raise CorpusError(f"expected one TSV file or two aligned files, got {paths}")


def _count_lines(path):
    count, last = 0, b"\n"
    with _open_text(path) as f:
        try:
            for block in iter(lambda: f.read(1 << 20), b""):
                count += block.count(b"\n")
                last = block[-1:]
        except (EOFError, OSError, zlib.error) as error:
            raise CorpusError(f"{path}: unreadable ({_reason(error)})") from None
    return count + (last != b"\n")  # a last line without a newline counts too


def check_files(spec):
    """Checks user files before any work: one existing, non-empty TSV, or two non-empty files with
    as many lines each (two files are read once to count them). Invalid lines are found, with
    their number, when the text is read.

    Args:
      spec: as for `read_files`.

    Raises:
      CorpusError: one line naming the file.
    """
    paths = [p for p in spec.split(",") if p]
    if len(paths) not in (1, 2):
        raise CorpusError(f"expected one TSV file or two aligned files, got {spec!r}")
    for path in paths:
        if os.path.isdir(path):
            raise CorpusError(f"{path} is a directory, not a file")
        if not os.path.exists(path):
            hint = _not_found_hint(path)
            raise CorpusError(f"{repr(path) if hint else path}: file not found{hint}")
        if not stat.S_ISREG(os.stat(path).st_mode):  # a pipe would be empty at the next read
            raise CorpusError(
                f"{path} is a pipe or a device (a shell's <(...)?), which can be read once, and "
                "train.py reads a corpus more than once (to count its lines, learn the "
                "vocabulary, write the records): write it to a file first (`paste train.de "
                "train.en > train.tsv`)")
        try:
            with _open_text(path) as f:
                start, first = head(f), f.readline()
        except OSError as error:  # unreadable, or .gz that is not gzip
            raise CorpusError(f"{path}: {error.strerror or error}") from None
        if not first:
            raise CorpusError(f"{path} is empty")
        if message := wide_encoding_message(path, start):  # its tab and line count deceive
            raise CorpusError(message)
        if len(paths) == 1 and b"\t" not in first:
            raise CorpusError(f"{path}: its first line holds no tab, and one file is read as "
                              "a TSV (source<TAB>target): for a file per side give both, "
                              f"source first ({path},<the target side's file>)")
    if len(paths) == 2:
        counts = [_count_lines(path) for path in paths]
        if counts[0] != counts[1]:
            raise CorpusError(f"{paths[0]} has {counts[0]:,d} lines but {paths[1]} has "
                              f"{counts[1]:,d}: the files are not line-aligned")


def _not_found_hint(path):
    """Why a path given for a corpus may not be found, where that shows: a blank around it
    (and whether the name without it exists), or a wildcard (the files are named one by
    one)."""
    if path != path.strip():
        if os.path.exists(path.strip()):
            return f" (a blank around the name: {path.strip()!r} exists)"
        return " (a blank around the name)"
    if any(c in path for c in "*?["):
        return " (wildcards are not expanded: name each corpus, repeating the flag)"
    return ""


def network_available(host="storage.googleapis.com", port=443, timeout=3.0):
    """Whether a TFDS download could start at all (checked before tfds retries for minutes).

    Args:
      host, port: where TFDS downloads from.
      timeout: seconds to wait for a connection.

    Returns:
      True when a TCP connection opens.
    """
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def tfds_split_name(split):
    """The TFDS name of a split ("dev" is TFDS's "validation").

    Args:
      split: "train", "dev" or "test".

    Returns:
      The TFDS split name.
    """
    return {"dev": "validation"}.get(split, split)


TFDS_READ_BATCH = 1024  # pairs read from a TFDS dataset at once
# Where the embedded corpus is prepared for TFDS when TFDS's default directory cannot be
# written (in the temporary directory).
LOCAL_TFDS_DIR = f"tfnmt-tensorflow_datasets-{os.getuid()}" if hasattr(os, "getuid") \
    else "tfnmt-tensorflow_datasets"


def read_tfds(name, split, data_dir=None, download=True):
    """Reads pairs from a TFDS translation dataset, in its supervised_keys order
    (`wmt14_translate/de-en` gives German -> English, `ted_hrlr_translate/pt_to_en`
    Portuguese -> English).

    Args:
      name: the TFDS dataset name (with its config).
      split: "train", "dev" or "test".
      data_dir: where TFDS datasets are prepared.
      download: prepare the dataset if it is not (needs the network).

    Yields:
      (source, target) strings.

    Raises:
      CorpusError: the dataset is unknown or lacks the split, or it is not prepared and the
        network is down (at once).
    """
    import tensorflow_datasets as tfds

    import tfnmt.data.tfds_embedded  # noqa: F401  registers the embedded corpus' builder

    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as error:  # tfds raises its own DatasetNotFoundError and friends
        raise CorpusError(f"unknown dataset {name!r}: {error}".splitlines()[0]) from None
    if getattr(builder, "LOCAL", False) and data_dir is None and not builder.is_prepared() \
            and cannot_write_in(builder.data_dir):
        # TFDS's default directory in a read-only home (a container's): the embedded corpus,
        # which nobody asked to keep there, is prepared in the temporary directory instead.
        builder = tfds.builder(name, data_dir=os.path.join(tempfile.gettempdir(),
                                                           LOCAL_TFDS_DIR))
    if not builder.is_prepared():
        if not download:
            raise CorpusError(f"dataset {name!r} is not prepared under {builder.data_dir}")
        if not getattr(builder, "LOCAL", False) and not network_available():
            raise CorpusError(
                f"dataset {name!r} is not prepared under {builder.data_dir} and this machine "
                "cannot reach the internet to download it. Prepare it where there is a network "
                f"(`tfds build {name}`), copy the data directory here and pass --tfds_data_dir, "
                "or use --dataset=embedded / --dataset=files.")
        builder.download_and_prepare()
    try:
        dataset = builder.as_dataset(split=tfds_split_name(split), as_supervised=True,
                                     shuffle_files=False)
    except (KeyError, ValueError) as error:
        raise CorpusError(f"dataset {name!r} has no {split!r} split "
                          f"(it has {', '.join(builder.info.splits)}): {error}") from None
    # Batches cross into Python: one element at a time costs ~0.3 ms of tf.data overhead each
    # (a minute for the embedded corpus' 47k pairs read twice, hours for WMT).
    for sources, targets in dataset.batch(TFDS_READ_BATCH).as_numpy_iterator():
        for source, target in zip(sources, targets):
            yield source.decode("utf-8", "replace"), target.decode("utf-8", "replace")


def train_specs(files):
    """The corpora of a files dict's train split.

    Args:
      files: {"train": spec or [spec, ...], ...} (a spec: a TSV path or "source,target").

    Returns:
      A list of specs, one per corpus.
    """
    specs = (files or {}).get("train")
    return list(specs) if isinstance(specs, (list, tuple)) else [specs]


def read_corpus(dataset, split, files=None, tfds_data_dir=None, log_skipped=True,
                reverse=False, download=True):
    """The sentence pairs of a split, skipping (and counting in the log) pairs with an empty
    side.

    Args:
      dataset: "embedded" (the German-English corpus in this repository), "files", or a
        TFDS translation dataset's name (e.g. "wmt14_translate/de-en").
      split: "train", "dev" or "test".
      files: with dataset "files": a TSV path, "source_path,target_path", or a list of
        these (several corpora, read one after the other).
      tfds_data_dir: where TFDS datasets are prepared.
      log_skipped: log the count of skipped pairs, once per process and split (off for a
        second pass over the same text).
      reverse: translate the other way: each pair's second side is the source.
      download: prepare a TFDS dataset that is not (`read_tfds`).

    Yields:
      (source, target) strings.

    Raises:
      CorpusError: bad or missing input (one line, naming the file and line).
    """
    if split not in SPLITS:
        raise CorpusError(f"split must be one of {SPLITS}, got {split!r}")
    if dataset == EMBEDDED:
        pairs = read_embedded(split)
    elif dataset == "files":
        if not files:
            raise CorpusError(f"--dataset=files needs --{split}_files (a TSV or 'src,tgt')")
        pairs = itertools.chain.from_iterable(
            read_files(spec) for spec in (files if isinstance(files, (list, tuple)) else [files]))
    else:
        pairs = read_tfds(dataset, split, tfds_data_dir, download)
    skipped = 0
    for source, target in pairs:
        source, target = source.strip(), target.strip()
        if not source or not target:
            skipped += 1
            continue
        yield (target, source) if reverse else (source, target)
    key = (dataset, split, repr(files), reverse)
    if skipped and log_skipped and key not in _logged_skips:
        _logged_skips.add(key)
        logging.warning("%s/%s: skipped %d pair%s with an empty side", dataset, split, skipped,
                        "" if skipped == 1 else "s")


def read_embedded(split):
    """The embedded corpus' (German, English) pairs of a split, in file order, read from
    tfnmt/data/de-en/<split>.tsv.gz: what its TFDS builder (`tfds_embedded`, `tfnmt_de_en`)
    gives, without TensorFlow or a prepared copy.

    Args:
      split: "train", "dev" or "test".

    Yields:
      (German, English) strings.
    """
    # The repository's own files: UTF-8, German, English and a source column per line.
    with gzip.open(os.path.join(EMBEDDED_DIR, f"{split}.tsv.gz"), "rt", encoding="utf-8") as lines:
        for line in lines:
            german, english = line.rstrip("\r\n").split("\t")[:2]
            yield german, english


def read_split(data, split, download=True):
    """The sentence pairs of a run's split, as `read_corpus` reads them.

    Args:
      data: a run's data settings (settings.json's "data": dataset, files, tfds_data_dir,
        reverse).
      split: "train", "dev" or "test".
      download: prepare a TFDS dataset that is not (`read_tfds`).

    Yields:
      (source, target) strings.
    """
    return read_corpus(data["dataset"], split, (data.get("files") or {}).get(split),
                       data.get("tfds_data_dir"), reverse=data.get("reverse", False),
                       download=download)
