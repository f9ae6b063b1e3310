"""tfnmt/cli.py: what the entry points share."""
import pytest

from tfnmt import cli


def test_read_lines_splits_at_newlines_only_and_drops_a_byte_order_mark(tmp_path):
    path = tmp_path / "in.txt"
    text = "\ufeffa\u2028b\r\nc\x0cd\x85e\r\n\r\n\ufefff\rg"
    path.write_bytes(text.encode("utf-8"))
    # Only the first three bytes are a byte order mark; U+FEFF later is text.
    assert cli.read_lines(str(path)) == ["a\u2028b", "c\x0cd\x85e", "", "\ufefff\rg"]
    path.write_bytes(b"")
    assert cli.read_lines(str(path)) == []
    path.write_bytes(b"\n")
    assert cli.read_lines(str(path)) == [""]
    # Invalid UTF-8: an error at its byte in the file (the mark counted), or U+FFFD.
    path.write_bytes(b"\xef\xbb\xbfok\nbad \xff\n")
    with pytest.raises(UnicodeDecodeError) as error:
        cli.read_lines(str(path))
    assert (error.value.start, error.value.reason) == (10, "invalid start byte")
    assert cli.read_lines(str(path), errors="replace") == ["ok", "bad \ufffd"]
