"""The kill -9 tests' child: a Python process killed with SIGKILL once it has said where it stands."""

import os
import signal
import subprocess
import sys


def first_line_then_kill_9(code: str) -> bytes:
    """Run ``code`` in a child interpreter, read the first line it prints (it then waits, reading its
    stdin), kill it with SIGKILL and reap it. Returns that line (b"" if the child ended first)."""
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        return child.stdout.readline()
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdin.close()
        child.stdout.close()
