"""systemd notification protocol (sd_notify(3)) without a dependency.

When ``NOTIFY_SOCKET`` is set (``Type=notify`` units), datagrams such as
``READY=1``, ``STATUS=...``, ``WATCHDOG=1`` and ``STOPPING=1`` go to it; when it
is not set every call is a no-op. An abstract socket is written ``@name``.
"""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self, env: dict[str, str] | None = None):
        env = os.environ if env is None else env
        path = env.get("NOTIFY_SOCKET", "")
        self._addr = ("\0" + path[1:]) if path.startswith("@") else path
        self._sock: socket.socket | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        ok_pid = not pid or pid == str(os.getpid())
        # systemd asks for a ping at least every WATCHDOG_USEC; we ping at a third of it
        self.watchdog_interval_s = int(usec) / 3e6 if usec.isdigit() and ok_pid and int(usec) > 0 else None

    @property
    def enabled(self) -> bool:
        return bool(self._addr)

    def send(self, *fields: str) -> bool:
        if not self._addr:
            return False
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            self._sock.sendto("\n".join(fields).encode(), self._addr)
            return True
        except OSError:
            return False    # systemd gone or socket full: never fatal to the crawl

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1", f"MAINPID={os.getpid()}", *((f"STATUS={status}",) if status else ()))

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def reloading(self) -> bool:
        return self.send("RELOADING=1")

    def stopping(self, status: str = "") -> bool:
        return self.send("STOPPING=1", *((f"STATUS={status}",) if status else ()))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
