"""tfnmt/text_lines.py: the line files translate.py and evaluate.py read and write."""
import gzip
import itertools
import re

import numpy as np
import pytest
from absl import app

from tfnmt import text_lines


def whole_file_lines(data, errors):
    """The reference: decode the whole file at once, then split at "\\n"."""
    start = 3 if data.startswith(b"\xef\xbb\xbf") else 0
    lines = data[start:].decode("utf-8", errors=errors).split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def is_utf8(data):
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_read_lines_splits_at_newlines_only_and_drops_a_byte_order_mark(tmp_path):
    path = tmp_path / "in.txt"
    text = "\ufeffa\u2028b\r\nc\x0cd\x85e\r\n\r\n\ufefff\rg"
    path.write_bytes(text.encode("utf-8"))
    # Only the first three bytes are a byte order mark; U+FEFF later is text.
    assert text_lines.read_lines(str(path)) == ["a\u2028b", "c\x0cd\x85e", "", "\ufefff\rg"]
    for data, lines in ((b"", []), (b"\n", [""]), (b"\xef\xbb\xbf", []),
                        (b"\xef\xbb\xbf\n", [""]), (b"a\r", ["a"])):
        path.write_bytes(data)
        assert text_lines.read_lines(str(path)) == lines, data
    # Invalid UTF-8: an error at its byte in the file (the mark counted), or U+FFFD.
    path.write_bytes(b"\xef\xbb\xbfok\nbad \xff\n")
    with pytest.raises(UnicodeDecodeError) as error:
        text_lines.read_lines(str(path))
    assert (error.value.start, error.value.reason) == (10, "invalid start byte")
    assert text_lines.read_lines(str(path), errors="replace") == ["ok", "bad \ufffd"]


@pytest.mark.parametrize("codec, named", [
    ("utf-16", "UTF-16"), ("utf-16-le", "UTF-16LE"), ("utf-16-be", "UTF-16BE"),
    ("utf-32", "UTF-32"), ("utf-32-le", "UTF-32LE"), ("utf-32-be", "UTF-32BE")])
def test_a_utf16_or_utf32_file_is_named_with_the_command_that_converts_it(codec, named,
                                                                          tmp_path):
    # Windows' "Unicode" text and PowerShell's `>` write UTF-16: read as UTF-8 it was "invalid
    # UTF-8", or, ASCII without a byte order mark, translated with a NUL between every letter.
    import subprocess

    text = "Das ist ein Haus.\tThat is a house.\nÜbung 日本\tpractice\n"
    path = tmp_path / "my train.tsv"
    path.write_bytes(text.encode(codec))
    with open(path, "rb") as f:
        first_line = next(f)
    assert text_lines.wide_encoding(first_line) == named
    assert path.read_bytes().decode(named) == text  # the name given is the file's codec
    with pytest.raises(app.UsageError) as error:
        text_lines.read_lines(str(path))
    message = str(error.value)
    command = re.fullmatch(rf"{re.escape(str(path))}: {named} text, not UTF-8 \(`(.+)` "
                           r"converts it\)", message).group(1)
    subprocess.run(command, shell=True, check=True, cwd=tmp_path)  # glibc's iconv
    assert (tmp_path / "my train.utf8.tsv").read_text(encoding="utf-8") == text
    gz = tmp_path / "in.txt.gz"
    gz.write_bytes(gzip.compress(text.encode(codec)))
    assert text_lines.wide_encoding_message(str(gz), first_line) == (
        f"{gz}: {named} text, not UTF-8 (`zcat {gz} | iconv -f {named} -t UTF-8 > "
        f"{tmp_path}/in.utf8.txt` converts it)")
    with pytest.raises(app.UsageError, match=f"^{re.escape(str(gz))}: {named} text"):
        text_lines.read_lines(str(gz))


@pytest.mark.parametrize("codec, named", [
    ("utf-16-le", "UTF-16LE"), ("utf-16-be", "UTF-16BE"), ("utf-32-le", "UTF-32LE"),
    ("utf-32-be", "UTF-32BE")])
def test_a_utf16_file_that_starts_with_an_empty_line_is_named_too(codec, named, tmp_path):
    # Its first line, split at b"\n", is one byte or none: judged by the file's first bytes.
    from tfnmt.data import corpus

    text = "\nDas ist ein Haus.\nÜbung 日本\n"
    path, english = tmp_path / "in.de", tmp_path / "in.en"
    path.write_bytes(text.encode(codec))
    english.write_text("\nThat is a house.\npractice\n", encoding="utf-8")
    assert path.read_bytes().decode(named) == text  # the name given is the file's codec
    message = f"{path}: {named} text, not UTF-8"
    with pytest.raises(app.UsageError, match=f"^{re.escape(message)}"):
        text_lines.read_lines(str(path))
    for read in (lambda: corpus.check_files(f"{path},{english}"),
                 lambda: list(corpus.read_files([str(path), str(english)]))):
        with pytest.raises(corpus.CorpusError, match=f"^{re.escape(message)}"):
            read()


@pytest.mark.parametrize("first_line", [
    b"Das ist ein Haus.\n", "Übung 日本 \u2028\n".encode(), b"\xef\xbb\xbfwith a mark\n",
    b"a stray \x00 byte in text\n", b"\n", b"", b"invalid \xff\xfe UTF-8\n"])
def test_utf8_text_is_not_taken_for_utf16(first_line):
    assert text_lines.wide_encoding(first_line) is None


def test_lines_read_one_at_a_time_are_the_whole_files_lines(tmp_path):
    # Random files of line breaks, byte order marks, multi-byte and invalid UTF-8 (a sequence
    # cut by a line break among them) against decoding the whole file at once.
    pieces = [b"\n", b"\r\n", b"\r", b"a", b"\xef\xbb\xbf", "ä".encode(), "€".encode(),
              b"\xc3", b"\xe2\x82", b"\xff", b" "]
    rng = np.random.default_rng(0)
    path, compressed = tmp_path / "in.txt", tmp_path / "in.txt.gz"
    for _ in range(300):
        data = b"".join(pieces[i] for i in rng.integers(len(pieces), size=rng.integers(12)))
        path.write_bytes(data)
        expected = whole_file_lines(data, "replace")
        invalid = []
        assert list(text_lines.iter_lines(str(path), "replace", invalid)) == expected, data
        # The lines that held invalid UTF-8: those of the file's lines (split at b"\n") that
        # Python's strict decoding refuses.
        body = data[3:] if data.startswith(b"\xef\xbb\xbf") else data
        chunks = body.split(b"\n")[:-1] if body.endswith(b"\n") else body.split(b"\n")
        assert invalid == [i + 1 for i, chunk in enumerate(chunks if body else [])
                           if not is_utf8(chunk)], data
        assert text_lines.count_lines(str(path)) == len(expected), data
        compressed.write_bytes(gzip.compress(data))  # .gz files read as train.py reads them
        assert text_lines.read_lines(str(compressed), errors="replace") == expected, data
        try:
            expected = whole_file_lines(data, "strict")
        except UnicodeDecodeError as error:
            with pytest.raises(UnicodeDecodeError) as raised:
                text_lines.read_lines(str(path))
            mark = 3 if data.startswith(b"\xef\xbb\xbf") else 0  # the offset is in the file
            assert (raised.value.start, raised.value.reason) == (error.start + mark,
                                                                 error.reason), data
        else:
            assert text_lines.read_lines(str(path)) == expected, data


def test_lines_of_invalid_utf8_are_named_in_one_message():
    assert text_lines.invalid_utf8_message([]) is None
    hint = ("not valid UTF-8: U+FFFD stands for the invalid bytes (a file in another "
            "encoding? `iconv -f latin1 -t utf-8` converts Latin-1)")
    assert text_lines.invalid_utf8_message([1234]) == f"line 1,234 is {hint}"
    assert text_lines.invalid_utf8_message([2, 5, 9]) == f"lines 2, 5 and 9 are {hint}"
    assert text_lines.invalid_utf8_message(list(range(1, 15)), most_named=3) == (
        f"lines 1, 2, 3 and 11 more are {hint}")


def test_windows_take_from_their_source_only_what_they_give():
    taken = []

    def source():
        for i in range(7):
            taken.append(i)
            yield i

    windows = text_lines.windows(source(), 3)
    assert next(windows) == [0, 1, 2] and taken == [0, 1, 2]
    assert list(windows) == [[3, 4, 5], [6]]
    assert list(text_lines.windows([], 3)) == []


@pytest.mark.parametrize("other, message", [
    (["x", "y"], "--target_prefix has 2 lines, fewer than the input"),
    (["x", "y", "z", "w"], "--target_prefix has more lines than the input's 3"),
])
def test_paired_lines_of_unequal_files_end_in_a_usage_error(other, message, tmp_path):
    path = tmp_path / "prefixes.en"
    path.write_text("".join(line + "\n" for line in other), encoding="utf-8")
    pairs = text_lines.paired_lines(iter(["a", "b", "c"]), str(path), "target_prefix")
    # The pairs before the end are given (their output is written) before the error.
    assert list(itertools.islice(pairs, 2)) == [("a", "x"), ("b", "y")]
    with pytest.raises(app.UsageError, match=message):
        list(pairs)
    path.write_text("x\ny\nz\n", encoding="utf-8")
    assert list(text_lines.paired_lines(["a", "b", "c"], str(path), "target_prefix")) == [
        ("a", "x"), ("b", "y"), ("c", "z")]


def test_line_writer_creates_its_file_at_the_first_write_and_flushes_each(tmp_path):
    path = tmp_path / "out.en"
    writer = text_lines.LineWriter(str(path))
    assert not path.exists()
    writer.write(["a\nb", "c\r\nd"])  # a line break inside a line would misalign the file
    assert path.read_text(encoding="utf-8") == "a b\nc  d\n"
    writer.write(["e"])
    assert path.read_text(encoding="utf-8") == "a b\nc  d\ne\n"
    writer.close()


def test_a_damaged_or_mislabelled_gz_is_one_line_naming_the_last_line_read(tmp_path):
    data = gzip.compress("".join(f"Satz {i}\n" for i in range(20000)).encode())
    path = tmp_path / "cut.de.gz"
    path.write_bytes(data[:len(data) // 2])
    good = 0  # what Python's gzip yields before its error: the reference
    with gzip.open(path, "rb") as f, pytest.raises(EOFError):
        for good, _ in enumerate(f, 1):
            pass
    assert 0 < good < 20000
    with pytest.raises(app.UsageError, match=re.escape(f"{path}: unreadable after line "
                                                       f"{good:,d} (Compressed file ended")):
        text_lines.read_lines(str(path))
    path.write_bytes(b"Ein Satz.\n")  # not gzip at all
    with pytest.raises(app.UsageError, match="unreadable after line 0 .Not a gzipped file"):
        text_lines.read_lines(str(path))


def test_line_writer_compresses_a_gz_output(tmp_path):
    path = tmp_path / "out.en.gz"
    writer = text_lines.LineWriter(str(path))
    writer.write(["a", "b"])
    writer.write(["c"])
    writer.close()
    assert gzip.decompress(path.read_bytes()) == b"a\nb\nc\n"
    assert text_lines.read_lines(str(path)) == ["a", "b", "c"]


def test_a_file_that_cannot_be_written_is_named_with_the_lines_it_got(tmp_path):
    # /dev/full fails every write with ENOSPC, as a full disk does.
    writer = text_lines.LineWriter("/dev/full")
    with pytest.raises(text_lines.OutputError, match=r"^/dev/full: No space left on device; 0 "
                                                     r"lines were written in full before it$"):
        writer.write(["a", "b"])
    writer.close()  # the first failure is the one told: closing does not raise another
    # Lines written before a failure are counted; a reader that went away passes unchanged.
    path = tmp_path / "out.en"
    writer = text_lines.LineWriter(str(path))
    writer.write(["one", "two"])
    writer.close()
    assert writer.written == 2 and path.read_text() == "one\ntwo\n"

    class GoneReader:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    writer = text_lines.LineWriter("-")
    writer.file = GoneReader()
    with pytest.raises(BrokenPipeError):
        writer.write(["x"])


def test_column_cuts_write_each_column_to_its_file(tmp_path):
    import subprocess

    rows = [["1", "Ein Haus.", "A house.", "x"], ["2", "Ja, ja.", "Yes, yes.", "y"]]
    data = "".join("\t".join(row) + "\n" for row in rows)
    folder = tmp_path / "my corpora"  # commands to copy: a path with a blank is one word
    folder.mkdir()
    plain = folder / "pairs.tsv"
    plain.write_text(data, encoding="utf-8")
    packed = folder / "packed.tsv.gz"
    packed.write_bytes(gzip.compress(data.encode()))
    for path, stem in ((plain, folder / "pairs"), (packed, folder / "packed")):
        commands, outputs = text_lines.column_cuts(str(path), [3, 2])
        assert outputs == [f"{stem}.3", f"{stem}.2"]
        subprocess.run(["bash", "-c", commands], check=True)
        for column, output in zip([3, 2], outputs):
            with open(output, encoding="utf-8") as f:
                assert f.read().splitlines() == [row[column - 1] for row in rows]


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("group", [1, 3])
def test_held_output_keeps_whole_items_and_appending_goes_on_after_them(suffix, group,
                                                                          tmp_path):
    # Files as a killed run leaves them: cut after any byte (a partial line; for .gz, a
    # damaged stream too). The items kept are counted from the text split by hand (for a
    # damaged stream, at most those before the cut: gzip gives none of the block it fails
    # in), and a writer appending after `keep_held` gives a file that reads as the kept lines
    # and the new.
    import zlib

    rng = np.random.default_rng(group)
    lines = [f"{n} ||| {'ä' * int(rng.integers(0, 5))}" for n in range(12)]
    text = "".join(line + "\n" for line in lines).encode()
    whole = gzip.compress(text) if suffix else text
    for cut in sorted(set(rng.integers(0, len(whole) + 1, 12).tolist()) | {0, len(whole)}):
        path = str(tmp_path / f"out{cut}{suffix}")
        with open(path, "wb") as f:
            f.write(whole[:cut])
        held = text_lines.held_output(path, group)
        if suffix and cut == 1:  # not even gzip's two-byte magic: not a gzip file
            assert held.unreadable == "Not a gzipped file (b'\\x1f')" and held.items == 0
            continue
        damaged = bool(suffix) and 0 < cut < len(whole)
        readable = zlib.decompressobj(31).decompress(whole[:cut]) if suffix else text[:cut]
        complete = readable.count(b"\n") // group
        assert held.damaged == damaged and held.unreadable is None
        assert held.items <= complete if damaged else held.items == complete
        kept = lines[:held.items * group]
        assert held.end == sum(len(line.encode()) + 1 for line in kept)
        assert held.last == (kept[-1] if kept else None)
        if not damaged:
            assert held.lines == readable.count(b"\n")
            assert held.extra == len(readable) - held.end
        text_lines.keep_held(path, held)
        writer = text_lines.LineWriter(path, append=True)
        writer.write(["new"])
        writer.close()
        assert list(text_lines.iter_lines(path)) == kept + ["new"]
    assert vars(text_lines.held_output(str(tmp_path / f"absent{suffix}"), group)) == vars(
        text_lines.HeldOutput())
    if suffix:  # corrupt data, which no killed run leaves: unreadable, not cut
        corrupt = bytearray(whole)
        corrupt[len(whole) // 2] ^= 0xFF
        (tmp_path / "corrupt.gz").write_bytes(bytes(corrupt))
        assert text_lines.held_output(str(tmp_path / "corrupt.gz"), group).unreadable
