"""Locks that keep a prepared data directory (train.py --data_dir, which several runs may share)
unchanged while training runs read it.

Two flock'ed files in the directory:

  .prepare.lock  held exclusively while a process checks the directory and prepares it, so
                 one prepares at a time and another run with the same data waits for it,
                 then finds the data up to date;
  .in_use.lock   held shared by each process that has prepared or checked the directory,
                 until it ends (or calls `release`); held exclusively while files change, so
                 a run that would rewrite data another run is reading is refused
                 (`DataDirInUseError`) instead of changing the records under it.

The operating system releases both when a process exits, however it exits. A directory where
the lock files cannot be written (read-only), or on a filesystem without flock, is used
unlocked, with a warning.

Example:
  with preparing(data_dir) as claim:
      if not up_to_date:
          claim("it holds data prepared with vocab_size 8000 (asked: 16000)")
          ...  # write the files
  ...  # read the records; release(data_dir) when done (or exit)
"""
import contextlib
import fcntl
import logging
import os

PREPARE_LOCK = ".prepare.lock"
IN_USE_LOCK = ".in_use.lock"

_in_use = {}  # real path of a data directory -> its .in_use.lock file this process holds shared
_unlockable = set()  # directories whose filesystem refused flock (warned once each)


class DataDirInUseError(ValueError):
    """A prepared data directory that must change for this run while another run reads it."""


def _unlocked(directory, error):
    if directory not in _unlockable:
        _unlockable.add(directory)
        logging.warning("%s: cannot lock it (%s); runs sharing it must not prepare it at the "
                        "same time", directory, error.strerror)


def _open(directory, name):
    """The lock file `name` in `directory`, or None where it cannot be written (a read-only
    directory of prepared data is read unlocked)."""
    try:
        return open(os.path.join(directory, name), "a+")
    except OSError as error:
        _unlocked(directory, error)
        return None


def _lock(file, operation, directory):
    """flock(file, operation): True when taken, False when another process holds a conflicting
    lock (non-blocking operations); True where there is no lock file or the filesystem has no
    flock."""
    if file is None:
        return True
    try:
        fcntl.flock(file, operation)
        return True
    except BlockingIOError:
        return False
    except OSError as error:  # e.g. ENOLCK on a network filesystem without locks
        _unlocked(directory, error)
        return True


@contextlib.contextmanager
def preparing(data_dir):
    """Held while this process checks and prepares `data_dir`: one process at a time.

    Args:
      data_dir: the prepared data directory (created if missing).

    Yields:
      claim(reason): call it before the first file of the directory changes. It returns when
      no other process reads the directory (and keeps them out until the block ends); else it
      raises DataDirInUseError with `reason`, which says why the directory must change.

    After the block, this process holds the directory shared until `release(data_dir)` or its
    exit; if the block raises, it holds nothing.
    """
    os.makedirs(data_dir, exist_ok=True)
    key = os.path.realpath(data_dir)
    prepare = _open(data_dir, PREPARE_LOCK)
    with prepare or contextlib.nullcontext():
        if not _lock(prepare, fcntl.LOCK_EX | fcntl.LOCK_NB, key):
            logging.warning("%s: waiting for another run to finish preparing it", data_dir)
            _lock(prepare, fcntl.LOCK_EX, key)
        in_use = _in_use.pop(key, None) or _open(data_dir, IN_USE_LOCK)

        def claim(reason):
            # Converting a shared lock drops it first, also when the conversion fails: taken
            # again below. No other process takes it meanwhile: that needs .prepare.lock.
            if not _lock(in_use, fcntl.LOCK_EX | fcntl.LOCK_NB, key):
                _lock(in_use, fcntl.LOCK_SH, key)
                raise DataDirInUseError(f"{data_dir}: {reason}, and another training run is "
                                        "reading it: give this run its own data directory "
                                        "(--data_dir), or run it when that run has ended")

        try:
            yield claim
            _lock(in_use, fcntl.LOCK_SH, key)  # before .prepare.lock is released
        except BaseException:
            if in_use is not None:
                in_use.close()
            raise
        if in_use is not None:
            _in_use[key] = in_use


def release(data_dir):
    """Ends this process's reading of `data_dir` (no-op where it holds nothing)."""
    in_use = _in_use.pop(os.path.realpath(data_dir), None)
    if in_use is not None:
        in_use.close()
