"""Per-IP politeness across machines: a shard's IP slot table that asks the IP's owner first.

``ClusterIpSlots`` has the interface the frontier uses of the machine's slot table
(``try_acquire(key, now, delay_s)``, ``release(key, now, delay_s)``) and wraps it: a lease on an
IP takes a cell of the machine's table (same-machine shards share the IP as without a cluster)
only while this shard holds a grant for the IP from its owner shard, ``key mod N`` (the turn
table of ``cluster.ipturns``). Without a grant the lease is put off (the answer is a time to look
again) and the grant is asked for in the background, so the frontier's lease step never waits on
the network. Grants are renewed while the shard leases on the IP; a lapsed grant with nothing in
flight is given back (``done``, with what is left of the IP's gap here).

Questions go to their owner in batches, one outstanding request per owner (core NATS
request/reply on ``crawlerd.<crawl>.ips.<owner>``; a question this shard owns is answered in
process). A question with no answer (owner not running, a timeout) grants nothing: the IP waits,
politeness is never traded for progress. ``IpTurnService`` is the owner's side: the process
holding the shard's lease answers with its ``IpTurns``.

Wire (JSON): question ``{"n": node, "s": shard, "w": [key, ...], "d": [[key, due_in_s], ...]}``
(``done`` first, then ``want``); answer ``{"r": [seconds, ...]}`` aligned with ``w`` (> 0: a
grant of that many seconds; < 0: wait that many seconds before asking again).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from crawlerd.cluster.answerer import Answerer
from crawlerd.cluster.engine import Link, stop_tasks
from crawlerd.cluster.ipturns import IpTurns

log = logging.getLogger("crawlerd.cluster")

ASK_TIMEOUT_S = 1.0
# After a question found no owner (or no answer in time), its IPs wait this long before the next.
NO_OWNER_WAIT_S = 0.5
# A lease put off for want of a grant looks again after about one round trip (1.25 x a running
# mean: the answer is there by then, the lease step is not repeated for nothing), at least
# ASK_RETRY_S, at most ASK_RETRY_MAX_S later.
ASK_RETRY_S = 0.02
ASK_RETRY_MAX_S = 1.0
# The owner's waits are capped at this, so a turn freed early is seen soon.
ASK_AGAIN_MAX_S = 0.5
# Questions for one owner are gathered this long before they go.
GATHER_S = 0.005


class ClusterIpSlots:
    """This shard's side. Keys of ``grants``: IP key -> local expiry (``time.monotonic()``);
    ``inflight``: IP key -> cells of the machine's table this shard holds for it.

    Invariant: a cell is taken only while the key's grant has not expired locally; a key is in
    ``done_pending`` only after its grant lapsed with nothing in flight, and is never asked for
    (``want``) until the owner answered that ``done``.
    """

    def __init__(self, local, *, shard: int, shards: int, node: str, grant_s: float, link: Link | None = None,
                 own: IpTurns | None = None):
        self.local = local
        self.shard, self.shards, self.node = shard, shards, node
        self.link = link
        self.own = own                  # this shard's own turn table (its own IPs: no network)
        self.grants: dict[int, float] = {}
        self.inflight: dict[int, int] = {}
        self.not_before: dict[int, float] = {}
        self.done_pending: dict[int, float] = {}     # key -> due_in_s to report
        self._want: dict[int, set[int]] = {}         # owner -> keys to ask
        self._asking: set[int] = set()
        self._wake: dict[int, asyncio.Event] = {}
        self._tasks: list[asyncio.Task] = []
        self._grant_s = grant_s
        self.rtt_s = ASK_RETRY_S               # running mean of a question's round trip
        self.stats = {"asks": 0, "ask_bytes": 0, "answer_bytes": 0, "no_answer": 0, "grants": 0, "waits": 0,
                      "renewals": 0, "own_asks": 0, "dones": 0, "put_off": 0}

    # -- the frontier's interface (synchronous, on the shard's loop) ---------------------------
    def try_acquire(self, key: int, now: float, delay_s: float) -> float:
        """0.0: a cell taken; else the time to look again (as ``IPSlots.try_acquire``)."""
        exp = self.grants.get(key)
        if exp is not None and exp > now:
            if exp - now < self._grant_s / 2:
                self._ask(key, now)     # renew ahead of the expiry
            w = self.local.try_acquire(key, now, delay_s)
            if w == 0.0:
                self.inflight[key] = self.inflight.get(key, 0) + 1
            return w
        self.stats["put_off"] += 1
        if exp is not None:
            self._lapse(key, now)
        self._ask(key, now)
        exp = self.grants.get(key)
        if exp is not None and exp > now:   # granted at once by this shard's own table
            return self.try_acquire(key, now, delay_s)
        return max(self.not_before.get(key, 0.0), now + min(max(1.25 * self.rtt_s, ASK_RETRY_S), ASK_RETRY_MAX_S))

    def release(self, key: int, now: float, delay_s: float) -> bool:
        freed = self.local.release(key, now, delay_s)
        n = self.inflight.get(key, 0) - 1
        if n > 0:
            self.inflight[key] = n
        else:
            self.inflight.pop(key, None)
            exp = self.grants.get(key)
            if exp is not None and exp <= now:
                self._lapse(key, now)
        return freed

    def close(self) -> None:
        """The machine's table stays open: it is the member's (``MemberParts.close``)."""

    # -- grants --------------------------------------------------------------------------------
    def _owner(self, key: int) -> int:
        return key % self.shards

    def _lapse(self, key: int, now: float) -> None:
        """The grant of ``key`` expired: give it back once nothing is in flight (and no renewal
        is being asked: its answer could grant again what this ``done`` gives back)."""
        if self.inflight.get(key) or key in self._asking:
            return
        self.grants.pop(key, None)
        due_in = max(self.local.due(key) - now, 0.0)
        o = self._owner(key)
        if o == self.shard and self.own is not None:
            self.own.done(key, self.node, self.shard, due_in, now)
            self.stats["dones"] += 1
            return
        self.done_pending[key] = due_in
        self._kick(o)

    def _ask(self, key: int, now: float) -> None:
        if key in self._asking or key in self.done_pending or self.not_before.get(key, 0.0) > now:
            return
        o = self._owner(key)
        if o == self.shard and self.own is not None:
            r = self.own.want(key, self.node, self.shard, now)
            self._answer(key, r, now, now)
            self.stats["own_asks"] += 1
            return
        if self.link is None:
            return
        self._asking.add(key)
        self._want.setdefault(o, set()).add(key)
        self._kick(o)

    def _answer(self, key: int, r: float, sent: float, got: float) -> None:
        if r > 0:
            if key in self.grants:
                self.stats["renewals"] += 1
            self.grants[key] = sent + r      # counted from the question's sending: ends no later
            self.not_before.pop(key, None)   # than the owner's expiry
            self.stats["grants"] += 1
        else:
            self.not_before[key] = got + min(-r, ASK_AGAIN_MAX_S)
            self.stats["waits"] += 1

    def _kick(self, owner: int) -> None:
        ev = self._wake.get(owner)
        if ev is None:
            if self.link is None:
                return
            ev = self._wake[owner] = asyncio.Event()
            self._tasks.append(asyncio.ensure_future(self._asker(owner, ev)))
        ev.set()

    async def _asker(self, owner: int, ev: asyncio.Event) -> None:
        """One request at a time to ``owner``: its dones and wants gathered since the last."""
        subject = self.link.names.ips_subject(owner)
        while True:
            await ev.wait()
            ev.clear()
            await asyncio.sleep(GATHER_S)
            want = sorted(self._want.pop(owner, ()))
            dones = [[k, d] for k, d in self.done_pending.items() if self._owner(k) == owner]
            if not want and not dones:
                continue
            body = json.dumps({"n": self.node, "s": self.shard, "w": want, "d": dones},
                              separators=(",", ":")).encode()
            sent = time.monotonic()
            self.stats["asks"] += 1
            self.stats["ask_bytes"] += len(body)
            try:
                nc = self.link.nc
                if nc is None or nc.is_closed:
                    raise ConnectionError("link closed")
                msg = await nc.request(subject, body, timeout=ASK_TIMEOUT_S)
                answers = json.loads(msg.data)["r"]
                self.stats["answer_bytes"] += len(msg.data)
            except asyncio.CancelledError:
                raise
            except Exception as e:      # no responders, a timeout, a reconnecting link: nothing granted
                log.debug("ip grants from shard %d: %r", owner, e)
                self.stats["no_answer"] += 1
                got = time.monotonic()
                for k in want:
                    self._asking.discard(k)
                    self.not_before[k] = got + NO_OWNER_WAIT_S
                if dones:               # told again with the next question
                    await asyncio.sleep(NO_OWNER_WAIT_S)
                    ev.set()
                continue
            got = time.monotonic()
            self.rtt_s += 0.2 * (got - sent - self.rtt_s)
            for k, _d in dones:
                self.done_pending.pop(k, None)
                self.stats["dones"] += 1
            for k, r in zip(want, answers, strict=True):
                self._asking.discard(k)
                self._answer(k, float(r), sent, got)

    async def sweep(self) -> None:
        """Every 100 ms: lapsed grants with nothing in flight are given back."""
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            for k in [k for k, exp in self.grants.items() if exp <= now and not self.inflight.get(k)]:
                self._lapse(k, now)
            if self.own is not None:
                self.own.sweep(now)
            if len(self.not_before) > 4096:
                for k in [k for k, t in self.not_before.items() if t < now]:
                    del self.not_before[k]

    def start(self) -> None:
        self._tasks.append(asyncio.ensure_future(self.sweep()))

    async def stop(self, timeout_s: float = 2.0) -> None:
        """Give back every grant with nothing in flight (its owner need not wait for its expiry),
        then stop asking."""
        now = time.monotonic()
        for k in [k for k in self.grants if not self.inflight.get(k)]:
            self.grants[k] = now            # lapsed now: ``_lapse`` hands it back
            self._lapse(k, now)
        owners = {self._owner(k) for k in self.done_pending}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.done_pending and loop.time() < deadline and owners <= set(self._wake):
            await asyncio.sleep(0.02)
        await stop_tasks(self._tasks)
        self._tasks = []

    def snapshot(self) -> dict:
        out = dict(self.stats, held=len(self.grants), inflight=sum(self.inflight.values()),
                   rtt_ms=round(1000 * self.rtt_s, 2))
        if self.own is not None:
            out.update(owner_turns=self.own.held(), owner_granted=self.own.granted,
                       owner_waited=self.own.waited, owner_expired=self.own.expired)
        return out


class IpTurnService(Answerer):
    """Answers the IP questions other shards send to shard ``shard`` with its ``IpTurns``."""

    what = "ip question"

    def __init__(self, link: Link, shard: int, turns: IpTurns):
        super().__init__(link, link.names.ips_subject(shard))
        self.turns = turns

    def answer(self, data: bytes) -> bytes:
        return self.handle(data, time.monotonic())

    def handle(self, data: bytes, now: float) -> bytes:
        q = json.loads(data)
        node, shard = str(q["n"]), int(q["s"])
        for k, due_in in q.get("d", ()):
            self.turns.done(int(k), node, shard, float(due_in), now)
        r = [self.turns.want(int(k), node, shard, now) for k in q.get("w", ())]
        return json.dumps({"r": r}, separators=(",", ":")).encode()
