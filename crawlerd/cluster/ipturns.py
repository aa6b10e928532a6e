"""Per-IP turns across machines: the owner's table of which node may send to an IP now.

Every IP has one owner shard, ``ip_key(ip) mod N``, wherever it runs (``cluster.ipgrants``
carries the questions). The owner hands an IP to one *node* at a time for a **turn**: while the
turn is that node's, its shards that asked hold a grant each (renewed while they use the IP) and
share the IP among themselves through their machine's slot table (``_native/ipslots.pyx``:
``per_ip_concurrency`` cells and the ``ip_delay_s`` due time), exactly as without a cluster. No
other node sends to the IP until the turn is over, so the per-IP bounds hold across the cluster.

A turn ends when every shard of the node that held a grant said ``done`` (its grant lapsed and
none of its requests to the IP is still in flight; ``due_in`` carries what is left of the IP's
gap on that machine) or, for a shard that never says it (dead, frozen, cut off), ``drain_s``
after its grant's expiry: its requests started before the expiry end within the fetch's
whole-transfer timeout. While another node waits, the holder's grants are not renewed (they
lapse within ``grant_s``) and the next turn is reserved for the node that waited longest.

Times are the owner's ``time.monotonic()``; durations cross machines, never instants. A grant of
``grant_s`` is counted by the asker from the moment it *sent* its question (earlier than the
owner's stamp), a wait from the moment the answer arrived (later than the owner's): both err
towards waiting longer. An IP several nodes want is *contended* for ``CONTENDED_S``: its grants
last ``CONTENDED_GRANT_S``, so the turn moves after about one request. ``quiet_s`` after an owner process starts it grants nothing, when an
earlier process of the shard may have left grants that are still running.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# A waiting node keeps its reservation this long after its last question, seconds (askers ask
# again well within it: ``ipgrants.ASK_AGAIN_MAX_S``).
RESERVE_S = 2.0
# The shortest wait an answer names, seconds.
MIN_WAIT_S = 0.02
# An IP two nodes asked for within this is contended: its grants are short, so nodes take turns
# of about one request rather than of a whole ``grant_s``, seconds.
CONTENDED_S = 10.0
CONTENDED_GRANT_S = 0.5


@dataclass(slots=True)
class Turn:
    """One IP's state at its owner. Key: the IP's ``ip_key``.

    Invariant: ``node`` is None exactly when ``grants`` is empty; every shard in ``grants`` is
    a shard of ``node``; nobody is granted before ``free_at``. ``waiting``: node -> (the first,
    the last time it asked while the turn was not its), forgotten ``RESERVE_S`` after the last.
    """
    node: str | None = None
    grants: dict[int, float] = field(default_factory=dict)     # shard -> expiry (owner clock)
    free_at: float = 0.0
    waiting: dict[str, list[float]] = field(default_factory=dict)
    contended_until: float = 0.0


class IpTurns:
    """The owner's table: ``want`` and ``done`` questions in, grants and waits out (module doc)."""

    def __init__(self, *, grant_s: float, drain_s: float, now: float, quiet_s: float = 0.0):
        if not grant_s > 0:
            raise ValueError(f"grant_s = {grant_s!r}: must be positive")
        self.grant_s = grant_s
        self.drain_s = drain_s
        self.quiet_until = now + quiet_s
        self.turns: dict[int, Turn] = {}
        self.granted = 0
        self.waited = 0
        self.expired = 0            # grants ended by expiry + drain (no ``done`` came)
        self._last_sweep = now

    def _settle(self, st: Turn, now: float) -> None:
        """End the grants whose shard never said done, ``drain_s`` after their expiry."""
        if st.grants:
            gone = [s for s, exp in st.grants.items() if now >= exp + self.drain_s]
            for s in gone:
                end = st.grants.pop(s) + self.drain_s
                if end > st.free_at:
                    st.free_at = end
                self.expired += 1
            if not st.grants:
                st.node = None
        if st.waiting:
            for n in [n for n, (_first, last) in st.waiting.items() if now - last > RESERVE_S]:
                del st.waiting[n]

    def want(self, key: int, node: str, shard: int, now: float) -> float:
        """Shard ``shard`` of ``node`` asks to send to IP ``key``: the grant's length in seconds
        (> 0), or minus the seconds to wait before asking again (< 0)."""
        st = self.turns.get(key)
        if st is None:
            st = self.turns[key] = Turn()
        else:
            self._settle(st, now)
        if st.node is None:
            start = max(st.free_at, self.quiet_until)
            others = [w[0] for n, w in st.waiting.items() if n != node]
            mine = st.waiting.get(node)
            if now < start or (others and (mine[0] if mine else now) > min(others)):
                # the IP's gap is still running, or the next turn is another node's (it waited longer)
                self._wait(st, node, now)
                return -max(start - now, MIN_WAIT_S)
            st.node = node
            st.waiting.pop(node, None)
        elif st.node != node:
            self._wait(st, node, now)
            return -max(max(st.grants.values()) - now, MIN_WAIT_S)
        elif any(n != node for n in st.waiting):
            # another node waits: no renewal, no newcomer; this node's grants lapse
            self.waited += 1
            return -max(st.grants.get(shard, max(st.grants.values(), default=now)) - now, MIN_WAIT_S)
        g = self.grant_s if now >= st.contended_until else min(self.grant_s, CONTENDED_GRANT_S)
        st.grants[shard] = now + g
        self.granted += 1
        return g

    def _wait(self, st: Turn, node: str, now: float) -> None:
        if st.node is not None and st.node != node:
            st.contended_until = now + CONTENDED_S
        w = st.waiting.get(node)
        if w is None:
            st.waiting[node] = [now, now]
        else:
            w[1] = now
        self.waited += 1

    def done(self, key: int, node: str, shard: int, due_in_s: float, now: float) -> None:
        """Shard ``shard`` of ``node`` no longer holds IP ``key`` and has nothing in flight to
        it; the IP's gap on its machine ends ``due_in_s`` from now."""
        st = self.turns.get(key)
        if st is None or st.node != node or shard not in st.grants:
            return                      # a repeat, or a grant this owner already ended
        del st.grants[shard]
        end = now + max(due_in_s, 0.0)
        if end > st.free_at:
            st.free_at = end
        if not st.grants:
            st.node = None

    def sweep(self, now: float, every_s: float = 10.0) -> int:
        """Forget idle IPs (no turn, gap over, nobody waiting); at most every ``every_s``."""
        if now - self._last_sweep < every_s:
            return 0
        self._last_sweep = now
        idle = []
        for k, st in self.turns.items():
            self._settle(st, now)
            if st.node is None and not st.waiting and st.free_at <= now:
                idle.append(k)
        for k in idle:
            del self.turns[k]
        return len(idle)

    def held(self) -> int:
        return sum(1 for st in self.turns.values() if st.node is not None)
