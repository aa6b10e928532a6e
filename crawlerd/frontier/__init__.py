"""The frontier: where a URL waits between the seen-set and the fetcher.

Born and queued
    A URL reaches ``Frontier.add`` only after the DRUM seen-set found it new
    (and budgets let it through). It is written to LMDB at once, in the back
    queue of its host (key ``host id | level | seq``): one FIFO per host and
    priority level, so RAM never holds queued URLs (ARCHITECTURE.md invariant 4). A host with
    work gets an *active* slot (a few dozen bytes of politeness state in
    ``hosts.HostTable``) while there is room under ``max_active_hosts``;
    otherwise it waits in a front queue of its best priority level, and hosts
    move from those front queues into freed slots by a weighted pick across
    levels (Mercator, Heydon & Najork 1999, §3.2), so low levels are slower
    but never starved. URLs of a blocked host are dropped here with a reason.
    With ``deferred_level`` one more level follows the others: a host serves it
    only when nothing else of it is queued (suspected duplicate URLs, ``dust``),
    and ``promote_deferred`` moves its URLs up once they are suspects no more.

Scheduled
    An active host first needs an address: ``hosts_needing_dns`` lists it, the
    shard resolves it and answers ``set_host_ip``. Only then does the host
    enter the due-time heap (``crawlerd._native.heap``), keyed by the earliest
    start politeness allows. The heap holds exactly the hosts that have work,
    no lease beyond their limit (one, ARCHITECTURE.md invariant 1) and a known address — one
    entry per host however long its queue, so a host with a million URLs
    never holds up the others. The heap is split (``working``): the frontier
    leases from a working set of hosts, each for a bounded session, so a
    crawl bound by its own rate comes back to the same hosts every gap and
    reuses their connections; the other ready hosts wait idle, first ready
    first in, and join when due members cannot fill the free slots.

Leased
    ``lease`` pops due hosts. A host whose address is at
    ``per_ip_concurrency`` parks in that IP's waiter heap until a request to
    the IP ends; one whose robots.txt is unknown or stale gets a single
    ``robots`` lease first (RFC 9309 §2.4). Otherwise the host's level is
    chosen by the ruler sequence (level 0 every 2nd pick, 1 every 4th, ...) and
    the head URL of that level moves, in the same LMDB transaction, from its
    queue to the ``leases`` table: a crash returns it to the front of its queue.

Released
    ``complete`` ends a lease. The host's next start becomes the end of this
    request plus ``clamp(delay_factor x response time, min, max)``, raised to
    Crawl-delay, raised again by backoff after failures: Retry-After on
    429/503, otherwise doubling with jitter, and parking after a long run of
    failures (IRLbot §6). A URL that got no usable answer goes back to the
    front of its queue and is dead-lettered after ``max_attempts``; anything
    else counts as completed. Leases not completed by their deadline come back
    through ``expire_leases``. Every URL ends completed, dead-lettered or
    dropped with a reason, or is still queued or leased; the counters in
    ``stats`` add up, and ``check_invariants`` proves it.

Restarted
    Host records hold absolute wall-clock times: a host's due is its last
    request's end plus its gap (or a backoff), so a restart resumes every host
    at its own time, and a clean stop records every active host's due. Which
    requests were in flight at a ``kill -9``, and how the ones since the last
    commit ended, is in the in-flight journal (``journal``, written before a
    request starts, no fsync: the page cache outlives the process). Only hosts
    whose request may have been cut off wait a whole gap, counted as if the
    request had lasted until the restart; without a journal of this boot (an
    OS crash) every host waits the grace of ``Politeness.restart_grace_s``.

Modules: ``scheduler`` (the Frontier: add, the lease and release calls, DNS and robots
answers), ``durability`` (its commits: when, what they write, what follows a landing, the
journal's rotation, close), ``schedule`` (where each active host waits, what a DNS answer changes,
slots for waiting hosts), ``working`` (the working set and its sessions), ``leasing`` (one host's lease taken and given back), ``restart``
(the last run's leases and dues back), ``operations`` (its operator side: blocklist, drops,
stats, invariant checks), ``queues`` (LMDB tables and durability), ``journal`` (requests in
flight), ``hosts`` (per-host state), ``ips`` (per-IP state), ``keyindex`` (compact key ->
slot index), ``politeness`` (the gap rule), ``blocklist``, ``items`` (records and their byte
layouts), ``budgets`` (STAR/BEAST); ``dust`` (per-host URL rewrite rules learned from
archived pages and the admission decisions they make; ``dust_evidence``, ``dust_rules``,
``dust_priors``, ``dust_hosts``, ``dust_suspects``, ``dust_store``), used by the shard
between the seen-set and ``Frontier.add``.
"""

from crawlerd.frontier.items import KIND_ROBOTS, KIND_URL, Lease, QueuedURL
from crawlerd.frontier.scheduler import Frontier

__all__ = ["Frontier", "KIND_ROBOTS", "KIND_URL", "Lease", "QueuedURL"]
