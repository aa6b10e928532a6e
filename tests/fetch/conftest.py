import socket

import pytest


@pytest.fixture
def silent_port():
    """A loopback port whose SYNs are dropped (nothing accepts and its accept queue is full): only
    curl's connect timeout, so only its timer, ends a request to it. Its sockets close after the test."""
    listener = socket.socket()
    socks = [listener]
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        for _ in range(3):
            s = socket.socket()
            socks.append(s)
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
        yield port
    finally:
        for s in socks:
            s.close()
