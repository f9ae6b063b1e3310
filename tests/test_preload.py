"""tests/preload_server.py and tests/preload_client.py, which run the suite's entry points: a
program run through them gets what the same program started fresh gets (its arguments, standard
streams, working directory and exit code; a signal sent to the process the test holds, and death
by it), and the program dies with the client that stands for it."""
import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

import helpers
from helpers import PRELOAD, ROOT, entry_point_command, preload_server
from preload_server import PER_PROGRAM

CLIENT = os.path.join(ROOT, "tests", "preload_client.py")

# Says what it was given; then exits with the code its first argument names, or waits for a
# signal ("wait", once it has printed its pid).
PROBE = r"""
import json, os, sys
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "stdin": sys.stdin.read(),
                  "path": sys.path[0], "name": __name__, "file": __file__,
                  "streams": [[s.encoding, s.errors, s.line_buffering, s.write_through,
                               type(s.buffer).__name__, s.buffer.raw.isatty()
                               if hasattr(s.buffer, "raw") else s.buffer.isatty()]
                              for s in (sys.stdin, sys.stdout, sys.stderr)],
                  "per_program": {name: os.environ.get(name) for name in PER_PROGRAM},
                  "preloaded": "tensorflow" in sys.modules}), flush=True)
print("Grüße an stderr", file=sys.stderr)
if sys.argv[1] == "wait":
    print(os.getpid(), flush=True)
    sys.stdin.close()
    import signal
    while True:
        signal.pause()
sys.exit(int(sys.argv[1]))
""".replace("PER_PROGRAM", repr(PER_PROGRAM))


@pytest.fixture
def probe(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    return str(tmp_path / "probe.py")


def commands(script):
    """{"fresh": `python <script>`, "server": the same through this worker's decode server}."""
    return {"fresh": [sys.executable, script],
            "server": [sys.executable, CLIENT, preload_server("decode"), script]}


# The variables a program reads only while it runs (preload_server.PER_PROGRAM) as the suite
# has them, then each changed: set, or unset (PYTHONUNBUFFERED also changes the streams).
ENVIRONMENTS = [{}, {"TF_CONFIG": '{"cluster": {}}', "PYTEST_CURRENT_TEST": "a test",
                     "PYTHONUNBUFFERED": "" if os.environ.get("PYTHONUNBUFFERED") else "1"}]


@pytest.mark.parametrize("changes", ENVIRONMENTS)
def test_a_program_run_by_the_server_gets_what_a_fresh_process_gets(changes, probe, tmp_path):
    environment = {k: v for k, v in dict(os.environ, **changes).items() if v}
    results = {route: subprocess.run([*command, "3", "ä b"], cwd=tmp_path, env=environment,
                                     input="zwei\nZeilen\n", capture_output=True, text=True,
                                     timeout=120)
               for route, command in commands(probe).items()}
    said = {route: json.loads(result.stdout) for route, result in results.items()}
    # The server's child has TensorFlow imported already: it ran there, not in a fallback.
    assert said["server"].pop("preloaded") is True and said["fresh"].pop("preloaded") is False
    assert said["server"] == said["fresh"] == {
        "argv": [probe, "3", "ä b"], "cwd": str(tmp_path), "stdin": "zwei\nZeilen\n",
        "path": os.path.dirname(probe), "name": "__main__", "file": probe,
        "streams": said["fresh"]["streams"],
        "per_program": {name: environment.get(name) for name in PER_PROGRAM}}
    unbuffered = bool(environment.get("PYTHONUNBUFFERED"))
    assert said["fresh"]["streams"][1][3] is unbuffered  # stdout's write-through
    assert results["server"].stderr == results["fresh"].stderr == "Grüße an stderr\n"
    assert results["server"].returncode == results["fresh"].returncode == 3


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_reaches_the_program_and_the_client_dies_as_it_did(signum, probe):
    for route, command in commands(probe).items():
        process = subprocess.Popen([*command, "wait"], text=True, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                    signal.SIG_DFL))
        try:
            said = json.loads(process.stdout.readline())
            process.stdout.readline()  # its pid: it waits for the signal now
            process.send_signal(signum)
            out, err = process.communicate(timeout=60)
        finally:
            process.kill()
        assert said["preloaded"] is (route == "server")
        assert process.returncode == -signum, (route, err)
        if signum == signal.SIGINT:  # Python's KeyboardInterrupt, then death by SIGINT
            assert err.splitlines()[-1] == "KeyboardInterrupt", (route, err)


def test_a_killed_client_takes_its_program_down(probe):
    process = subprocess.Popen(commands(probe)["server"] + ["wait"], text=True,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    try:
        assert json.loads(process.stdout.readline())["preloaded"] is True
        program = int(process.stdout.readline())
        assert program != process.pid
        started = process_stat(program)[19]  # running
        process.kill()
        process.wait(timeout=60)
    finally:
        process.kill()
    deadline = time.monotonic() + 60
    while (stat := process_stat(program)) and stat[19] == started \
            and time.monotonic() < deadline:
        time.sleep(0.05)  # killed by the server, then reaped by it
    # Gone (its number may since belong to another process or thread, which started later).
    server = helpers._servers["decode"][0]
    assert not stat or stat[19] != started, (
        f"state {stat[0]}, parent {stat[1]}; the decode server {server.pid}, exit "
        f"{server.poll()}")


@pytest.mark.parametrize("reply", ["not awaited", "unread"])
def test_a_client_gone_before_it_read_its_programs_pid_takes_it_down(probe, tmp_path, reply):
    # A client killed while the server forks its program (a busy machine can run the program
    # before the server tells the client its pid): the server's reply fails, or the client's
    # end closes with the reply unread (the server's end is reset); either way the program is
    # killed, not left running, and the server serves on.
    import socket

    read_end, write_end = os.pipe()
    with open(os.devnull) as stdin, socket.socket(socket.AF_UNIX) as client:
        client.connect(preload_server("decode"))
        request = json.dumps({"argv": [probe, "wait"], "cwd": str(tmp_path),
                              "environ": dict(os.environ)}) + "\n"
        socket.send_fds(client, [request.encode()], [stdin.fileno(), write_end, write_end])
        if reply == "unread":
            assert select.select([client], [], [], 60)[0] == [client]  # the reply has come
    os.close(write_end)
    # The pipe ends once the program's copies are gone: with it (killed or never started).
    with os.fdopen(read_end) as output:
        deadline = time.monotonic() + 60
        while select.select([output], [], [], 1)[0] == [] or output.readline():
            assert time.monotonic() < deadline, "the program still runs"
    result = subprocess.run(commands(probe)["server"] + ["3"], capture_output=True, text=True,
                            stdin=subprocess.DEVNULL, timeout=120)
    assert result.returncode == 3 and json.loads(result.stdout)["preloaded"] is True


def process_stat(pid):
    """Fields 3 on of /proc/<pid>/stat (state, parent pid, ..., at 19 the start time in clock
    ticks since boot), or None where no process or thread has that number."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None


def test_entry_points_go_through_the_server_only_with_its_environment():
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    fresh = [sys.executable, os.path.join(ROOT, "train.py")]
    assert entry_point_command("train.py", dict(environment, TF_CPP_MIN_LOG_LEVEL="0")) == fresh
    assert entry_point_command("train.py", dict(environment, TF_ENABLE_ONEDNN_OPTS="0",
                                                SOME_SETTING="x")) == fresh
    through = entry_point_command("train.py", environment)
    decoding = entry_point_command("translate.py", environment)
    # A cluster's worker: its own TF_CONFIG (and, in some tests, unbuffered output).
    worker = dict(environment, TF_CONFIG='{"cluster": {}}', PYTHONUNBUFFERED="1")
    assert entry_point_command("train.py", worker) == through
    if PRELOAD:  # TFNMT_TEST_PRELOAD=0 sends every program fresh
        assert through == [sys.executable, CLIENT, preload_server("train"), fresh[1]]
        assert decoding == [sys.executable, CLIENT, preload_server("decode"),
                            os.path.join(ROOT, "translate.py")]
    else:
        assert through == fresh
