"""Runs an entry point in a child of tests/preload_server.py and ends as that child ends.

The test holds this process: the program's standard streams are this process's (passed to the
server), the signals a test sends it (Ctrl-C's SIGINT, SIGTERM, SIGHUP, ...) go on to the
program, and it exits with the program's exit code, or is killed by the signal that killed the
program. Killed itself (SIGKILL, a timeout), it takes the program down with it: the server
kills the program's process group when this connection closes. Where the server cannot take
the program (not running, or gone before the program started), this process becomes the
program: `python <script> <args>`, as without the server.

Usage: python tests/preload_client.py SOCKET_PATH SCRIPT [ARGS...]
"""
import json
import os
import signal
import socket
import sys

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)


def main():
    path, argv = sys.argv[1], sys.argv[2:]
    program = []  # its pid, once the server has started it
    pending = []  # signals that came before

    def forward(signum, frame):
        if program:
            os.kill(program[0], signum)
        else:
            pending.append(signum)

    before = {signum: signal.signal(signum, forward) for signum in FORWARDED}
    reply = ""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(path)
            request = json.dumps({"argv": argv, "cwd": os.getcwd(),
                                  "environ": dict(os.environ)}).encode() + b"\n"
            socket.send_fds(connection, [request], [0, 1, 2])
            replies = connection.makefile("r")
            reply = replies.readline()
            if reply.startswith("pid "):
                program.append(int(reply.split()[1]))
                for signum in pending:
                    os.kill(program[0], signum)
                reply = replies.readline()  # "status ...", or "" if the server died
    except OSError:
        pass
    if not program:  # the server did not start it: run it here
        for signum, handler in before.items():
            signal.signal(signum, handler)
        os.execv(sys.executable, [sys.executable, *argv])
    if not reply.startswith("status "):
        try:
            os.killpg(program[0], signal.SIGKILL)
        except OSError:
            pass
        print(f"{__file__}: the server went away while {argv[0]} ran", file=sys.stderr)
        os._exit(1)
    status = int(reply.split()[1])
    if os.WIFSIGNALED(status):  # die as the program died, by its signal
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
