"""Is this process in a private network namespace? (Only there may simweb bind 0.0.0.0.)

/sys/class/net is no guide: it shows the namespace that mounted sysfs, not ours. The kernel
answers for the calling process's namespace through if_nameindex() (netlink) and
/proc/self/net/dev, so those are what we ask.
"""

from __future__ import annotations

import ipaddress
import socket


def interfaces() -> list[str]:
    try:
        return sorted(name for _, name in socket.if_nameindex())
    except OSError:
        with open("/proc/self/net/dev", encoding="ascii") as f:
            return sorted(line.split(":", 1)[0].strip() for line in f.readlines()[2:] if ":" in line)


def in_private_netns() -> bool:
    """True when the only network interface is the loopback ``lo``."""
    return interfaces() == ["lo"]


def check_bind(addr: str) -> str | None:
    """None when simweb may listen on ``addr``, else the reason it may not.

    Loopback addresses are always fine; 0.0.0.0 only inside a private namespace, where every
    address is a loopback one; nothing else, ever.
    """
    if addr == "0.0.0.0":
        if in_private_netns():
            return None
        return ("--bind 0.0.0.0 is refused outside a private network namespace (interfaces here: "
                f"{', '.join(interfaces())}); use --bind 127.0.0.1, or run under "
                "`unshare -n sh -c 'ip link set lo up; ...'`")
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return f"--bind {addr!r} is not an IP address"
    if not ip.is_loopback:
        return f"--bind {addr} is not a loopback address (127.0.0.0/8 or ::1)"
    return None
