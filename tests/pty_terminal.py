"""A child process on a pseudo-terminal, and everything it draws (for `crawlerd top` tests)."""

import fcntl
import os
import pty
import re
import select
import struct
import sys
import termios
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]")


class Terminal:
    """A child process on a pty of 48 rows x 170 columns; collects everything it writes."""

    def __init__(self, argv: list[str]):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:                                   # child: size the terminal, become crawlerd top
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 48, 170, 0, 0))
            env = dict(os.environ, TERM="xterm-256color", PYTHONPATH=ROOT)
            env.pop("COLUMNS", None)
            env.pop("LINES", None)
            os.execve(sys.executable, [sys.executable, "-m", "crawlerd", *argv], env)
        self.raw = b""

    def text(self) -> str:
        return ANSI.sub(b"", self.raw).decode("utf-8", "replace")

    def read_until(self, cond, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond(self):
            left = deadline - time.monotonic()
            assert left > 0, f"timed out; screen so far:\n{self.text()[-3000:]}"
            r, _, _ = select.select([self.fd], [], [], min(left, 0.5))
            if r:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:        # EIO: the child closed the terminal
                    chunk = b""
                if not chunk:
                    assert cond(self), f"terminal closed; screen:\n{self.text()[-3000:]}"
                    return
                self.raw += chunk

    def frames(self) -> int:
        return self.raw.count(b"crawlerd top")

    def send(self, data: bytes) -> None:
        os.write(self.fd, data)

    def wait(self, timeout_s: float = 20.0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:                                            # drain so the child never blocks on a full pty
                r, _, _ = select.select([self.fd], [], [], 0.1)
                if r:
                    self.raw += os.read(self.fd, 65536)
            except OSError:
                pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, 9)
        os.waitpid(self.pid, 0)
        raise AssertionError(f"crawlerd top did not exit; screen:\n{self.text()[-3000:]}")

    def close(self) -> None:
        os.close(self.fd)
