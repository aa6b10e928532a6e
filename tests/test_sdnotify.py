import os
import socket

from crawlerd.sdnotify import Notifier


def test_messages_reach_fake_notify_socket(tmp_path):
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    try:
        n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "3000000"})
        assert n.enabled and n.watchdog_interval_s == 1.0
        assert n.ready("crawling")
        assert sock.recv(4096).decode().split("\n") == ["READY=1", f"MAINPID={os.getpid()}", "STATUS=crawling"]
        n.status("10 pages")
        assert sock.recv(4096) == b"STATUS=10 pages"
        n.watchdog()
        assert sock.recv(4096) == b"WATCHDOG=1"
        n.stopping("draining")
        assert sock.recv(4096) == b"STOPPING=1\nSTATUS=draining"
        n.close()
    finally:
        sock.close()


def test_abstract_socket_name():
    name = f"crawlerd-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    try:
        n = Notifier({"NOTIFY_SOCKET": "@" + name})
        n.ready()
        assert sock.recv(4096).startswith(b"READY=1")
    finally:
        sock.close()


def test_disabled_without_socket():
    n = Notifier({})
    assert not n.enabled and n.watchdog_interval_s is None
    assert n.ready() is False


def test_watchdog_pid_mismatch_disables_watchdog():
    n = Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
    assert n.watchdog_interval_s is None
