"""A process that has imported TensorFlow and tfnmt, and forks a child for each entry point a
test runs (tests/helpers.py: `python`, `started`), so that the suite's few hundred train.py,
export.py, translate.py and evaluate.py processes do not each import TensorFlow again (~2.7 s
of each on a 2-core EPYC).

A child is what `python <script> <args>` started fresh with the server's environment is once
its imports are done: the server did what `tfnmt.cli.run` does before TensorFlow is imported
(the allocator; oneDNN's kernels as a training or a decoding program chooses them; threads for
a CPU quota; the filtered start), imported TensorFlow and tfnmt, and touched nothing else of
TensorFlow's runtime. The child runs the script as `__main__`, with the client's standard
streams, working directory and arguments, in a process group of its own, and exits as Python
exits a script. tests/helpers.py sends a program here only when its script is of the server's
kind (train.py: "train"; the others: "decode") and its environment is the server's but for
variables read only while a program runs (TF_CONFIG, PYTHONUNBUFFERED), which the child takes
from the client.

One connection per program, from tests/preload_client.py: the client sends a JSON line
{"argv": [script, args...], "cwd": ..., "environ": {...}} with its file descriptors 0, 1 and 2;
the server answers "pid <pid>" once the child runs, then "status <wait status>" when it has
ended. A client that goes away first (a test's timeout killed it) has its child's process
group killed. The server prints "listening" once clients can connect, and ends when its
standard input (a pipe from the pytest worker) closes.

Usage: python tests/preload_server.py SOCKET_PATH train|decode
"""
import gc
import importlib
import io
import json
import os
import pkgutil
import runpy
import selectors
import signal
import socket
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Environment variables a program reads only while it runs, never at an import (TF_CONFIG:
# train.py and tf.distribute; PYTHONUNBUFFERED: `become` builds the standard streams by it),
# and pytest's PYTEST_CURRENT_TEST: a child takes the client's (or has none where it has none).
PER_PROGRAM = ("TF_CONFIG", "PYTHONUNBUFFERED", "PYTEST_CURRENT_TEST")


def prepare(kind):
    """What tfnmt.cli.run does before TensorFlow is imported (after the allocator), then the
    imports."""
    from tfnmt import cli

    cli.before_tensorflow(training=kind == "train")
    import tensorflow  # noqa: F401
    import tensorflow_text  # noqa: F401

    import tfnmt

    for module in pkgutil.walk_packages(tfnmt.__path__, "tfnmt."):
        if not module.name.startswith("tfnmt.programs"):
            importlib.import_module(module.name)
    from tensorflow.python.eager import context

    # A runtime started here (its threads, its devices) would be every child's, unsafely after
    # a fork. (Listing the physical devices, as the filtered start does, starts none.)
    started = getattr(context.context_safe(), "_context_handle", None)
    assert started is None, "an import started TensorFlow's runtime"
    gc.freeze()  # the children's collections leave these objects (and their pages) alone


def serve(listener):
    """Forks a child per request until this process ends; returns only in a child, with its
    (request, [stdin, stdout, stderr] descriptors)."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the select below
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    selector.register(0, selectors.EVENT_READ)  # a pipe from the pytest worker, until it ends
    connections = {}  # child pid: its client's connection (None once the client is gone)
    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                connection, _ = listener.accept()
                try:
                    message, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
                    while not message.endswith(b"\n"):  # the rest of a long line
                        more = connection.recv(1 << 16)
                        if not more:
                            raise OSError("the client went away mid-request")
                        message += more
                    request = json.loads(message)
                except (OSError, ValueError):
                    connection.close()  # the client runs the program itself
                    continue
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    for fileobj in [listener, wake_read, wake_write, connection,
                                    *filter(None, connections.values())]:
                        os.close(fileobj if isinstance(fileobj, int) else fileobj.detach())
                    selector.close()
                    return request, fds
                for fd in fds:
                    os.close(fd)
                try:
                    os.setpgid(pid, pid)  # as the child does: its group exists for a killpg
                except OSError:  # the child set it first
                    pass
                try:
                    connection.sendall(f"pid {pid}\n".encode())
                except OSError:  # the client is gone already (killed): so is its program
                    connection.close()
                    connections[pid] = None
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except OSError:
                        pass
                    continue
                connections[pid] = connection
                selector.register(connection, selectors.EVENT_READ, pid)
            elif key.fileobj == 0:
                if not os.read(0, 4096):
                    sys.exit(0)
            elif key.fileobj == wake_read:
                os.read(wake_read, 4096)
                while connections:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    connection = connections.pop(pid, None)
                    if connection is not None:
                        selector.unregister(connection)
                        try:
                            connection.sendall(f"status {status}\n".encode())
                        except OSError:
                            pass
                        connection.close()
            elif connections.get(key.data) is not key.fileobj:
                continue  # its program was reaped above, in this same round
            elif client_gone(key.fileobj):  # so is its program
                selector.unregister(key.fileobj)
                key.fileobj.close()
                connections[key.data] = None
                try:
                    os.killpg(key.data, signal.SIGKILL)
                except OSError:
                    pass


def client_gone(connection):
    """Whether a client's connection has ended: closed, or reset (a client that closes with
    the server's "pid" reply unread resets it)."""
    try:
        return not connection.recv(1)
    except OSError:
        return True


def standard_stream(fd, made, unbuffered):
    """sys.stdin (fd 0), sys.stdout (1) or sys.stderr (2) on that descriptor, as Python makes
    it at its start (CPython's create_stdio), for what the descriptor is now (a pipe, a file, a
    terminal); `made`: this process's own, for the encoding and errors; `unbuffered`: as
    `python -u` or PYTHONUNBUFFERED makes them."""
    writing = fd > 0
    raw = io.FileIO(fd, "wb" if writing else "rb", closefd=False)
    buffer = raw if unbuffered and writing else (
        io.BufferedWriter(raw) if writing else io.BufferedReader(raw))
    return io.TextIOWrapper(buffer, made.encoding, made.errors, newline="\n",
                            line_buffering=not unbuffered and (raw.isatty() or fd == 2),
                            write_through=unbuffered)


def become(request, fds):
    """Makes this forked child the process `python <script> <args>` would be."""
    os.setpgid(0, 0)
    for signum in (signal.SIGCHLD, signal.SIGHUP, signal.SIGTERM):  # as tests/helpers.py's
        signal.signal(signum, signal.SIG_DFL)                       # `started` leaves them
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in enumerate(fds):  # the server's own are 0-2: these are above
        os.dup2(fd, target)
        os.close(fd)
    unbuffered = bool(request["environ"].get("PYTHONUNBUFFERED"))  # the server has no -u
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        setattr(sys, name, standard_stream(fd, getattr(sys, name), unbuffered))
        setattr(sys, f"__{name}__", getattr(sys, name))
    for name in PER_PROGRAM:  # the rest is the server's, as a fresh program's start leaves it
        if name in request["environ"]:
            os.environ[name] = request["environ"][name]
        else:
            os.environ.pop(name, None)
    os.chdir(request["cwd"])
    script = os.path.abspath(request["argv"][0])
    sys.argv = list(request["argv"])
    sys.orig_argv = [sys.executable, *sys.argv]
    sys.path[0] = os.path.dirname(script)
    return script


def main():
    path, kind = sys.argv[1:]
    sys.path[0] = ROOT  # not tests/: a child's path starts with its script's directory
    from tfnmt import allocator, cli

    cli.leave_out_optional_imports()

    allocator.use_fast_allocator()  # may execute this server again, with tcmalloc preloaded
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)  # clients wait in the backlog while the imports run
    print("listening", flush=True)
    prepare(kind)
    request, fds = serve(listener)
    script = become(request, fds)
    runpy.run_path(script, run_name="__main__")  # its SystemExit ends this process as a script's


if __name__ == "__main__":
    main()
