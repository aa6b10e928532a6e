"""The configuration schema: every key with its type, default, unit, bounds and meaning.

The single source of defaults. ``config.toml`` at the repository root is generated from it
(``crawlerd config dump``); the loader that reads a file against it is :mod:`crawlerd.config`.
Units are part of the key names (``_s`` seconds, ``_bytes`` bytes). Keys marked ``runtime``
are re-read on SIGHUP; all others are fixed for the life of the process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PLACEHOLDER_CONTACT = "CHANGE-ME"



@dataclass(frozen=True, slots=True)
class Key:
    name: str
    type: type | tuple[type, ...]
    default: Any
    doc: str
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] | None = None
    item_type: type | None = None   # for lists
    runtime: bool = False


def _k(name, type_, default, doc, **kw) -> Key:
    return Key(name, type_, default, doc, **kw)


KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
DAY = 86400.0
YEAR = 365 * DAY
# x86-64 user address space is 2^47 bytes; an LMDB map is address space (checked at start too)
MAX_MAP_BYTES = 1 << 46

# Keys that were replaced: a config still naming one gets this hint, not only "unknown key"
RETIRED: dict[tuple[str, str], str] = {
    ("fetch", "max_connections"): "curl's connection cache is bounded in bytes now, set "
                                  "fetch.connection_cache_bytes (an idle HTTPS connection holds ~144 KiB)",
}

SCHEMA: dict[str, tuple[str, list[Key]]] = {
    "crawl": ("What to crawl, where state lives, and how the crawler names itself.", [
        _k("data_dir", str, "/var/lib/crawlerd",
           "Directory for all persistent state (frontier, seen-set, WARC, indexes, events)."),
        _k("user_agent", str,
           "crawlerd/0.1 (+https://example.org/crawlerd; operator: CHANGE-ME@example.org)",
           "Full User-Agent header. Must name a real operator contact: `crawlerd run` refuses "
           "to start while it still contains CHANGE-ME."),
        _k("seeds_file", str, "", "File of seed URLs, one per line (# comments allowed). Empty: none."),
        _k("max_pages", int, 0, "Stop after this many pages fetched (0: no limit).", min=0, max=1 << 62),
        _k("max_depth", int, 64, "Links further than this many hops from a seed are not queued.", min=0,
           max=100000),
        _k("shards", int, 0,
           "Crawl shards: hosts partitioned by registered domain, each shard its own process (one "
           "event loop, curl multi, frontier, DRUM, budgets and workers) when more than one. 0: "
           "chosen at the crawl's first start from the core count (cores // 4, at least 1: a shard's "
           "loop is one core at saturation and keeps about half a core of workers busy, bench/RESULTS.md). "
           "Fixed for the life of a crawl: recorded in <data_dir>/crawl.json, and a run asking for "
           "another count is refused.", min=0, max=256),
    ]),
    "handoff": ("URLs found by one shard for hosts another shard owns, handed over in batches.", [
        _k("max_pending_batches", int, 256,
           "Batches one shard may have waiting for another; at this many the sender waits "
           "(its leases complete only once their links are handed over).", min=1, max=1_000_000),
        _k("batch_records", int, 4096, "URLs per hand-off batch at most.", min=1, max=1_000_000),
        _k("flush_interval_s", float, 0.1, "Staged URLs are written as a batch at least this often, seconds.",
           min=0.001, max=10.0),
        _k("fsync", bool, False,
           "fsync every batch (survives power loss; without it a batch survives kill -9 of either "
           "side, like the seen-set's intake log)."),
    ]),
    "robots": ("robots.txt (RFC 9309).", [
        _k("agent_token", str, "crawlerd",
           "Product token matched against robots.txt user-agent lines (case-insensitive)."),
        _k("cache_ttl_s", float, 86400.0, "Longest a fetched robots.txt is trusted, seconds (RFC 9309 §2.4: 24 h).",
           min=1.0, max=86400.0),
        _k("error_retry_s", float, 600.0,
           "After a 5xx or network failure (disallow all), retry robots.txt after this many seconds.",
           min=1.0, max=86400.0),
        _k("crawl_delay_cap_s", float, 60.0, "Largest robots.txt Crawl-delay honoured, seconds.", min=0.0,
           max=DAY),
        _k("max_bytes", int, 512 * KiB, "Robots.txt bytes parsed; the rest is ignored (RFC 9309 §2.5: >= 500 KiB).",
           min=500 * KiB, max=64 * MiB),
        _k("cache_bytes", int, 64 * MiB,
           "RAM for parsed robots.txt rules (LRU by host, charged by the rules' estimated size), bytes. "
           "A host evicted from it is read back from the on-disk copy (or fetched again).",
           min=64 * KiB, max=1 << 40),
    ]),
    "sitemaps": ("Sitemaps (sitemaps.org 0.9): read when their host's robots.txt is read.", [
        _k("enabled", bool, True, "Read the sitemaps robots.txt announces (Sitemap: lines)."),
        _k("urls", list, [],
           "More sitemap URLs, read when their host's robots.txt is read (their hosts are seeded at start).",
           item_type=str),
        _k("max_fetches_per_host", int, 10,
           "Sitemap files (index children included) read per host each time its robots.txt is read.", min=0,
           max=10000),
        _k("max_urls", int, 50000, "URLs taken from one sitemap file (the protocol's limit).", min=1,
           max=10_000_000),
        _k("max_bytes", int, 50 * MiB, "Largest sitemap file after decompression (the protocol's limit), bytes.",
           min=1 * KiB, max=1 * GiB),
        _k("recent_s", float, 30 * 86400.0,
           "A sitemap URL whose lastmod is this recent gets the top priority, seconds.", min=0.0,
           max=YEAR * 100),
    ]),
    "politeness": ("Per-host and per-IP politeness (ARCHITECTURE.md invariant 1).", [
        _k("delay_factor", float, 10.0,
           "Gap after a request = clamp(delay_factor x its response time, min_delay_s, max_delay_s).", min=0.0,
           max=1000.0),
        _k("min_delay_s", float, 1.0, "Smallest gap between the end of one request to a host and the next, seconds.",
           min=0.0, max=DAY),
        _k("max_delay_s", float, 60.0, "Largest politeness gap from response time, seconds.", min=0.0, max=DAY),
        _k("per_ip_concurrency", int, 1, "Requests in flight at once to one IP address.", min=1, max=64),
        _k("host_concurrency", dict, {},
           "Operator allowance: hosts (scheme://host[:port]) allowed more than one request in flight, "
           "{ \"https://big.example\" = 4 } (at most 255; per-IP limits still apply).", item_type=int),
        _k("ip_delay_s", float, 0.0,
           "Smallest gap between requests to one IP address (on top of each host's own gap), seconds.", min=0.0,
           max=DAY),
        _k("shared_ip_slots", int, 1 << 20,
           "Entries of the per-IP slot table the shards of one machine share (a power of two; two "
           "addresses hashed to one entry only wait for each other).", min=1024, max=1 << 26),
        _k("backoff_base_s", float, 30.0, "First backoff after a 429/503/timeout/reset without Retry-After, seconds.",
           min=0.0, max=DAY),
        _k("backoff_max_s", float, 3600.0, "Largest backoff, seconds.", min=0.0, max=30 * DAY),
        _k("retry_after_cap_s", float, 86400.0, "Largest Retry-After honoured, seconds.", min=0.0, max=30 * DAY),
        _k("park_after_failures", int, 10, "Consecutive failures after which a host is parked.", min=1,
           max=1_000_000),
        _k("park_s", float, 6 * 3600.0, "How long a parked host waits, seconds (its URLs are kept).", min=0.0,
           max=30 * DAY),
    ]),
    "frontier": ("Frontier queues and leases.", [
        _k("priority_levels", int, 4,
           "Front-queue priority levels (0 is highest). One more level holds suspected duplicates "
           "(dust.defer_suspects): a host serves it only when nothing else of it is queued.", min=1, max=15),
        _k("lease_timeout_s", float, 300.0, "A leased URL not completed by then returns to its queue, seconds.",
           min=1.0, max=DAY),
        _k("max_attempts", int, 3, "Attempts before a URL goes to the dead-letter table.", min=1, max=100),
        _k("max_active_hosts", int, 200000, "Hosts with politeness state kept in RAM.", min=1, max=1 << 30),
        _k("working_set_max", int, 4096,
           "Most hosts leased from at once (the working set): a ready host joins when a free transfer slot "
           "finds no member due, and stays for a session, so its connection is reused across its politeness "
           "gap instead of reopened (and TLS renegotiated) every turn. The set sizes itself to what the "
           "crawl's rate needs below this cap; 0: off (every ready host in due-time order).", min=0,
           max=1 << 24),
        _k("queue_heads_bytes", int, 8 * MiB,
           "RAM for the first URLs (up to four) of the queues being leased from, kept so a lease pops its "
           "URL without a seek in the store, bytes, estimated per entry (key, URL record and the objects "
           "holding them); over it the queue filled longest ago is forgotten. The working set's queues "
           "take ~3-4 MiB at its default size; 0: none kept (every lease reads its queue's head from "
           "the store).", min=0, max=1 << 34),
        _k("session_fetches", int, 20,
           "Leases a working-set host makes before it goes to the back of the ready hosts (its last "
           "request closes its connection).", min=1, max=1_000_000),
        _k("session_s", float, 30.0,
           "Longest stay of a host in the working set, seconds (with session_fetches: every ready host "
           "gets a session in turn).", min=0.1, max=DAY),
        _k("map_size_bytes", int, 64 * GiB, "LMDB map size for the frontier (address space, not RAM).",
           min=16 * MiB, max=MAX_MAP_BYTES),
        _k("unlanded_bytes", int, 2 * MiB,
           "RAM for frontier and recrawl writes handed to the writer thread and not written yet (queued "
           "URLs, host records, recrawl states), bytes, estimated per write; they pile up while the writer "
           "falls behind. At half the bound leasing, the intake's next slice (after committing what it "
           "admitted so far) and the recrawl feed wait for a write to land (backpressure, nothing dropped); "
           "the answers of the transfers in flight still write. 0: no bound. `crawlerd stats`: "
           "memory.frontier_unlanded.", min=0, max=64 * GiB),
    ]),
    "recrawl": ("Recrawl with conditional GETs: adaptive per-URL revisit intervals (Cho & Garcia-Molina).", [
        _k("enabled", bool, True, "Refetch fetched URLs with If-None-Match / If-Modified-Since."),
        _k("initial_interval_s", float, 7 * 86400.0, "First revisit interval, seconds.", min=1.0, max=10 * YEAR),
        _k("min_interval_s", float, 86400.0, "Shortest interval (a page that keeps changing), seconds.", min=1.0,
           max=10 * YEAR),
        _k("max_interval_s", float, 90 * 86400.0,
           "Longest interval; also the wait after a 4xx/5xx answer, seconds.", min=1.0,
           max=10 * YEAR),
        _k("reissue_timeout_s", float, 86400.0,
           "A URL handed to the frontier and not fetched by then is handed out again, seconds.", min=1.0,
           max=YEAR),
        _k("drop_after_errors", int, 3, "Errors or unanswered hand-outs in a row before a URL leaves recrawl.",
           min=1, max=255),
        _k("jitter", float, 0.1, "+/- fraction applied to each interval.", min=0.0, max=0.99),
        _k("priority", int, 1, "Frontier priority level of recrawl URLs (0 is highest; below frontier.priority_levels).",
           min=0, max=15),
        _k("batch", int, 1000, "Due URLs moved to the frontier per second at most.", min=1, max=10_000_000),
        _k("max_queued", int, 100000,
           "Feed recrawl URLs only while the frontier holds fewer queued URLs than this (backpressure).", min=1,
           max=1 << 40),
        _k("map_size_bytes", int, 64 * GiB, "LMDB map size for recrawl state (address space, not RAM).",
           min=16 * MiB, max=MAX_MAP_BYTES),
        _k("read_cache_bytes", int, 16 * MiB,
           "RAM for URL states read during the crawl (a URL's state is read at its lease and again at its "
           "answer; an absent state is cached too, when key_filter_bytes did not rule it out), bytes, estimated at ~400 B per URL; least recently used "
           "go first. Exact (updated as commits land). 0: off. `crawlerd stats`: memory.recrawl_reads.",
           min=0, max=64 * GiB),
        _k("key_filter_bytes", int, 8 * MiB,
           "RAM for a filter of the URLs recrawl ever tracked (two bits per URL in a fixed bitmap, built "
           "at start from the store's keys): a URL it has never seen, most leased URLs, is known untracked "
           "without a read at its lease and its answer. Size it at 8 bits per tracked URL or more: a store "
           "found at start with more URLs than that is not scanned (every lookup reads, as with 0; the scan "
           "reads ~2 M keys a second); a crawl growing past it reads for more new URLs (~5 % at 1 URL per 8 "
           "bits, ~40 % at 1 per 2 bits, then all). Rounded down to a power of two. 0: off. `crawlerd stats`: "
           "recrawl.key_filter.", min=0, max=512 * MiB),
    ]),
    "budgets": ("Per-domain budgets against spam and traps (IRLbot §7: STAR reputation, BEAST queues). A "
                "registered domain may pass budget = min(max_budget, base_budget + per_inlink x in-degree) new URLs "
                "to the frontier per BEAST queue; the rest wait, in order, for later queues (never dropped). A URL "
                "is charged when it passes to the frontier and refunded if the frontier then drops it unfetched "
                "(blocked host, DNS failure) while the reader is on the same queue. Seed URLs are never charged.", [
        _k("enabled", bool, True,
           "Budget new URLs per registered domain; URLs over budget are deferred, not dropped."),
        _k("base_budget", int, 2,
           "URLs a registered domain with no in-links may pass per BEAST queue (IRLbot: a small base).", min=1,
           max=1 << 40),
        _k("per_inlink", int, 2, "Budget added per unit of in-degree (linear growth, STAR).", min=0, max=1 << 40),
        _k("max_budget", int, 100_000, "Largest budget of one registered domain per BEAST queue.", min=1,
           max=1 << 40),
        _k("indegree", str, "vouched",
           "How in-degree is counted. \"all\": distinct other registered domains linking to it (IRLbot). "
           "\"vouched\": only links whose source domain may vouch for them: seed domains vouch for every "
           "domain they link to, any other domain for at most vouch_ratio x its own in-degree of them "
           "(reputation flows from the seeds, so a farm of domains linking to each other earns little).",
           choices=("vouched", "all")),
        _k("vouch_ratio", float, 0.5, "See indegree: vouches a domain may give per unit of its own in-degree.",
           min=0.01, max=1.0),
        _k("probation", bool, True,
           "A domain no counted link vouches for (in-degree 0; not a seed's domain) passes nothing at "
           "intake: its URLs wait for the next BEAST queue, which the reader moves to as soon as the "
           "frontier runs short (so the fetcher still never idles), and while it stays over budget it "
           "passes once per window of queues instead of every queue; a vouch that raises its "
           "in-degree lets it pass at once. Off: it passes base_budget URLs in every queue it is found in."),
        _k("queues", int, 8,
           "BEAST queues in the first window; every wrap-around of the reader doubles the next window, and "
           "a domain still over budget then passes half as often.", min=1, max=1 << 30),
        _k("max_spread", int, 1024,
           "Most queues between two passes of one domain over budget (a power of two).", min=1, max=1 << 30),
        _k("min_ready_hosts", int, 0,
           "While fetch slots are free, the reader moves to the next BEAST queue as soon as fewer hosts "
           "than this are ready to be leased, or no host is due within 0.5 s (work-conserving: the fetcher "
           "never idles while deferred URLs exist). 0: the number of free fetch slots.", min=0, max=1 << 30),
        _k("readmit_batch", int, 1000,
           "Deferred URLs passed to the frontier per readmission step at most (every 0.1 s while it runs "
           "short, else every second), 200 per event-loop iteration.", min=1, max=10_000_000),
        _k("cache_entries", int, 65536, "Domains whose budget and in-degree records are cached in RAM (LRU).",
           min=16, max=1 << 30),
        _k("read_cache_bytes", int, 16 * MiB,
           "RAM for the host turns of deferring domains read during the crawl (one read per host and "
           "commit without it; not the host that started a domain's backlog, whose turn is in the "
           "domain's record), bytes, estimated at ~270 B per host; least recently used go first. Exact "
           "(updated as commits land). 0: off. `crawlerd stats`: memory.budget_turns.", min=0, max=64 * GiB),
        _k("unlanded_bytes", int, 2 * MiB,
           "RAM for budget writes handed to the writer thread and not written yet (BEAST's deferred URLs "
           "and domain records, the graph's records), bytes, estimated per write; they pile up while the "
           "writer falls behind. At the bound the loop's next intake, readmission or edge slice waits for "
           "a write to land (backpressure, nothing dropped). 0: no bound. `crawlerd stats`: "
           "memory.budget_unlanded.", min=0, max=64 * GiB),
        _k("map_size_bytes", int, 64 * GiB, "LMDB map size for budget state (address space, not RAM).",
           min=16 * MiB, max=MAX_MAP_BYTES),
        _k("edge_max_age_s", float, 5.0,
           "Domain-edge DRUM: merge once the oldest unmerged edge is this old, seconds (in-degree lag).",
           min=0.0, max=DAY),
        _k("edge_max_pending", int, 200_000, "Domain-edge DRUM: merge once this many edges wait.", min=1,
           max=1 << 40),
        _k("edge_merge_bytes", int, 64 * MiB,
           "Domain-edge DRUM: merge once its bucket files hold this much (merges never run more often than "
           "every ten merge durations).", min=64 * KiB, max=1 << 40),
        _k("edge_cache_entries", int, 1 << 18, "Domain-edge DRUM: recently seen edges kept in RAM.", min=0,
           max=1 << 30),
    ]),
    "fetch": ("HTTP fetching (pycurl multi on uvloop).", [
        _k("max_in_flight", int, 1000,
           "Transfers on the wire at once across all hosts (an answer waiting for or in a worker does not "
           "hold one; fewer while the workers' answer rate needs fewer: Little's law).", min=1, max=100000),
        _k("connect_timeout_s", float, 10.0, "TCP+TLS connect timeout, seconds (at most fetch.timeout_s).", min=0.1,
           max=600.0),
        _k("timeout_s", float, 60.0, "Whole-transfer timeout, seconds.", min=0.1, max=3600.0),
        _k("low_speed_bytes_per_s", int, 256, "A transfer slower than this for low_speed_time_s is dropped (too_slow).",
           min=1, max=1 << 40),
        _k("low_speed_time_s", int, 15, "See low_speed_bytes_per_s, seconds.", min=1, max=3600),
        _k("max_body_bytes", int, 10 * MiB, "Largest raw body kept; more ends the transfer (too_large).", min=1 * KiB,
           max=4 * GiB),
        _k("body_pool_bytes", int, 64 * MiB,
           "Shared memory for response bodies from the wire to their worker, bytes: one memfd carved into "
           "8 KiB blocks, outside malloc (a fixed cost, touched as far as it was ever full). A body that "
           "finds no free block goes on the heap instead (nothing waits, nothing is lost; `crawlerd stats`: "
           "memory.body_pool with its high_water_bytes, body_pool_fallbacks). Sized with process.queue_bytes, which bounds the bodies "
           "fetched and not archived yet.", min=64 * KiB, max=64 * GiB),
        _k("max_decoded_bytes", int, 20 * MiB, "Largest body after content decoding (bomb guard).", min=1 * KiB,
           max=4 * GiB),
        _k("max_header_bytes", int, 64 * KiB, "Largest response header block (headers_too_large).", min=1 * KiB,
           max=16 * MiB),
        _k("max_url_length", int, 2048, "Longest URL fetched or queued, bytes.", min=64, max=16384),
        _k("max_redirects", int, 5, "Redirect hops followed (each hop is a new URL through the frontier).",
           min=0, max=20),
        _k("connection_cache_bytes", int, 256 * MiB,
           "RAM for curl's cache of idle keep-alive connections, bytes: it keeps at most this divided by "
           "144 KiB (an idle HTTPS connection's TLS state and buffers; HTTP costs ~1.5 KiB) "
           "connections (CURLMOPT_MAXCONNECTS), closing the oldest idle one past that.",
           min=144 * KiB, max=64 * GiB),
        _k("keep_alive_idle_s", float, 5.0,
           "A connection is kept open after an answer only when its host has more URLs queued and its next "
           "turn is expected within this many seconds (hosts waiting / answers per second, or its politeness "
           "gap); idle connections older than this are closed, not reused (many servers drop them by then). "
           "Keeps curl's connection cache to the hosts that will use it.", min=0.0, max=3600.0),
        _k("verify_tls", bool, True,
           "Verify TLS certificates and host names (a page whose certificate fails is outcome tls_error). "
           "Off: record what a site serves whatever its certificate (an archival choice)."),
        _k("ca_file", str, "",
           "PEM file of CA certificates to trust instead of the system's store (a private or test CA). "
           "Empty: the system's CA store."),
        _k("shutdown_grace_s", float, 5.0, "On stop, in-flight fetches get this long before being abandoned, seconds.",
           min=0.0, max=600.0),
    ]),
    "dns": ("DNS resolution (aiodns / c-ares).", [
        _k("nameservers", list, [], "Nameservers as \"IP\" or \"IP:PORT\". Empty: the system's resolv.conf.",
           item_type=str),
        _k("timeout_s", float, 5.0, "Per-query timeout, seconds.", min=0.1, max=60.0),
        _k("tries", int, 2, "Attempts per query.", min=1, max=10),
        _k("min_ttl_s", float, 300.0, "Cache an answer at least this long, seconds.", min=0.0, max=7 * DAY),
        _k("max_ttl_s", float, 86400.0, "Cache an answer at most this long, seconds.", min=0.0, max=7 * DAY),
        _k("negative_ttl_s", float, 600.0, "Cache NXDOMAIN/SERVFAIL this long, seconds.", min=0.0, max=7 * DAY),
        _k("max_in_flight", int, 500, "DNS queries in flight at once.", min=1, max=100000),
        _k("static_hosts", dict, {},
           "Names answered locally without DNS, like /etc/hosts: { \"name\" = \"IP\" }.", item_type=str),
        _k("cache_bytes", int, 32 * MiB, "RAM for cached DNS answers (LRU, ~570 bytes per name), bytes.",
           min=64 * KiB, max=1 << 40),
    ]),
    "network": ("Where the fetcher may connect (ARCHITECTURE.md invariant 5).", [
        _k("allow", list, [],
           "Networks (CIDR) allowed even though private/loopback/link-local/reserved. "
           "Empty: only public addresses.", item_type=str, runtime=True),
        _k("ipv6", bool, False, "Resolve AAAA records and connect over IPv6."),
    ]),
    "blocklist": ("Operator blocklist: wins over everything, takes effect at once.", [
        _k("hosts", list, [],
           "Hosts or domains never fetched; a domain covers its subdomains. An entry deleted here is "
           "unblocked at the next SIGHUP or restart; entries added with `crawlerd block add` stay until "
           "`crawlerd block remove`.", item_type=str, runtime=True),
    ]),
    "drum": ("DRUM URL-seen set (IRLbot §4): RAM buckets spilled to disk, merged in one sequential pass.", [
        _k("buckets", int, 64, "Buckets k; keys are spread over them by their high bits.", min=1, max=4096),
        _k("bucket_buffer_bytes", int, 1 * MiB, "RAM buffer per bucket before it is appended to disk, bytes.",
           min=4 * KiB, max=1 * GiB),
        _k("merge_bytes", int, 256 * MiB, "Merge once the bucket files hold this many bytes in all.", min=64 * KiB,
           max=1 << 44),
        _k("max_age_s", float, 30.0, "Merge when the oldest pending key is this old, seconds.", min=0.0, max=DAY),
        _k("cache_entries", int, 1 << 20, "Recently seen fingerprints kept in RAM in front of DRUM (0: off).",
           min=0, max=1 << 30),
        _k("max_pending_keys", int, 1 << 18,
           "Keys waiting in RAM for the DRUM thread (during a merge), with those the fetches in flight can "
           "still submit (leases x the links a page gave so far), before leasing and hand-offs pause; never "
           "dropped. `crawlerd stats`: memory.seen_pending.",
           min=1, max=1 << 30),
    ]),
    "dedup": ("Content de-duplication.", [
        _k("simhash_distance", int, 3, "Near-duplicate when simhashes differ in at most this many bits.",
           min=0, max=3),
        _k("near_dup_demote_ratio", float, 0.5,
           "A host whose recent pages are at least this share near-duplicates drops in priority.", min=0.0, max=1.0),
        _k("near_index_ram_bytes", int, 64 * MiB,
           "RAM for the near-duplicate index's recent fingerprints; the rest lives in sorted block-table "
           "files under the shard's dedup/near-index (40 bytes per page on disk), merged in by a background "
           "thread, bytes.", min=4 * MiB, max=1 << 40),
        _k("worker_captures_bytes", int, 4 * MiB,
           "RAM per processing worker for the first captures it archived itself and the crawl process "
           "has not yet committed to the digest set (LRU, ~350 bytes per page), bytes.",
           min=64 * KiB, max=1 << 40),
        _k("host_windows_bytes", int, 16 * MiB,
           "RAM for per-host near-duplicate windows (trap demotion; LRU, ~470 bytes per host), bytes.",
           min=64 * KiB, max=1 << 40),
    ]),
    "dust": ("Per-host URL rewrite rules learned from archived pages (Bar-Yossef et al., WWW 2007; "
             "Dasgupta et al., KDD 2008): duplicate URL variants are not fetched.", [
        _k("enabled", bool, True,
           "Learn rules from archived pages; skip a new URL that a trusted rule maps onto archived "
           "content; queue declared rel=canonical URLs."),
        _k("confirmations", int, 3,
           "A rule is trusted after this many independent confirmations on its host (distinct "
           "pages, one of them the rewrite target itself) and no counter-example.", min=1, max=16),
        _k("sample_share", float, 0.02,
           "Share of the URLs a trusted rule would skip that are fetched anyway to re-validate it; "
           "one contradiction retires the rule and re-queues its logged skips.", min=0.0, max=1.0),
        _k("prior_hosts", int, 3,
           "A rule (e.g. ?utm_source, ;jsessionid) confirmed on this many hosts on their own evidence "
           "(each: a pair with its rewrite target; two distinct values for a rule over many values) "
           "becomes a cross-host prior: applied on other hosts without their own confirmations, "
           "re-validated there by prior_sample_share; 0 turns priors off.", min=0, max=1 << 20),
        _k("prior_counter_hosts", int, 2,
           "A prior is dropped once this many hosts have contradicted its rule (it is retired on "
           "each such host, which gets its skipped URLs back).", min=1, max=1 << 20),
        _k("prior_sample_share", float, 0.03,
           "Share of the URLs a rule trusted as a prior only would skip that are fetched anyway "
           "to re-validate it on that host.", min=0.0, max=1.0),
        _k("sample_halving", int, 5,
           "A rule's sample share (sample_share, or prior_sample_share for a prior) halves after each "
           "this many samples that agreed with it (on its host; for a cross-host prior's rule, on any "
           "host), down to min_sample_share; a contradiction still retires it on its host at once; 0 "
           "keeps the share fixed.", min=0, max=1 << 20),
        _k("min_sample_share", float, 0.002,
           "The least share of a trusted rule's would-be skips fetched to re-validate it, however "
           "many samples agreed (a share set below this is kept as set).", min=0.0, max=1.0),
        _k("defer_suspects", bool, True,
           "A URL that equals an admitted URL but for parameters not known to change content (or "
           "its first directory) waits in its host's deferred level until the host has nothing else."),
        _k("probe_share", float, 0.005,
           "Suspects fetched at once to gather evidence, as a share of pages archived (a probe "
           "that finds new content is not counted).", min=0.0, max=1.0),
        _k("initial_probes", int, 24,
           "Suspects the learner may fetch as probes before the budget of probe_share has grown "
           "(the cold start, when no rule or cross-host prior is known yet; each probe is at most "
           "one duplicate fetch, and one that finds new content is given back).", min=0, max=64),
        _k("evidence_per_host", int, 24, "Archived pages per host kept as evidence (the most recent).",
           min=2, max=256),
        _k("max_bytes", int, 256 * MiB,
           "Disk for rules, evidence, the archived set and the skip log (least recently used hosts "
           "and oldest captures go first), bytes.", min=1 * MiB, max=1 << 40),
        _k("max_host_bytes", int, 16 * KiB, "Largest rules + evidence record of one host, bytes.",
           min=2 * KiB, max=1 * MiB),
        _k("class_entries", int, 1 << 21,
           "Recently admitted URL skeletons kept in RAM to recognise suspects (8 bytes each).", min=1024,
           max=1 << 32),
        _k("cache_hosts", int, 2048, "Host records kept decoded in RAM, at most (dust.cache_bytes bounds their bytes).",
           min=16, max=1 << 20),
        _k("cache_bytes", int, 32 * MiB,
           "RAM for the host records kept decoded (rules and evidence of the hosts used last), bytes, "
           "estimated from the decoded objects (a plain host with a full evidence window costs ~4 KiB, "
           "one with URL variants, rules and parsed URLs ~16 KiB); the least recently used are written back and dropped past it. `crawlerd "
           "stats`: memory.dust_hosts.", min=64 * KiB, max=64 * GiB),
        _k("archived_filter_bytes", int, 4 * MiB,
           "RAM for Bloom filters over the archived set (one per generation, filled by a scan at start), "
           "bytes: a fetched URL never archived before is told apart without an LMDB read. About 20 bits "
           "per archived entry keeps false positives (a read that finds nothing) near 1%; the default "
           "suits dust.max_bytes = 256 MiB. 0: off (every look-up reads LMDB). `crawlerd stats`: "
           "memory.dust_archived_filter.", min=0, max=1 * GiB),
        _k("read_cache_bytes", int, 1 * MiB,
           "RAM for host records read or written last, as stored (encoded), bytes, estimated at ~230 B + "
           "the record's size per host (~600 B for a host with a few pages, ~2 KB with 24): a host whose "
           "decoded state dust.cache_bytes dropped is loaded again without an LMDB read (on the crawl loop, "
           "a hand-off of the GIL with the writer thread). Exact (every write of a record goes through it); "
           "least recently used go first. 1 MiB, not more: its values grow with their hosts' pages, so a "
           "larger cache fragments the crawl's C heap as they are replaced (20-min soaks, heap extent per "
           "page: +10.9 at 8 MiB, +0.6 at 1 MiB), and the reads it saves cost no measurable crawl CPU (two "
           "end-to-end pairs, 1 MiB against 8: crawl us/request x0.93 and x0.96). 0: off. `crawlerd stats`: "
           "memory.dust_reads.", min=0, max=64 * GiB),
        _k("unlanded_bytes", int, 1 * MiB,
           "RAM for DUST writes handed to the writer thread and not written yet (the host records a "
           "commit writes, the archived fingerprints and skip log since the last one), bytes, estimated "
           "per write; they pile up while the writer falls behind (a DUST commit waits for its fsync). At "
           "half the bound the commit's next slice of host records waits for a write to land "
           "(backpressure: the hosts stay changed in dust.cache_bytes' cache until written, nothing "
           "dropped). 0: no bound. `crawlerd stats`: memory.dust_unlanded.", min=0, max=64 * GiB),
    ]),
    "url_filter": ("URL filters and trap defences (each drop is counted by reason in `crawlerd stats`).", [
        _k("max_path_depth", int, 32, "Paths with more segments are dropped (path_too_deep).", min=1, max=4096),
        _k("max_repeated_segments", int, 2,
           "A run of path segments repeated more often than this is a trap (/a/b/a/b/a/b/).", min=1,
           max=4096),
        _k("max_query_params", int, 20, "URLs with more query parameters are dropped.", min=0, max=4096),
        _k("max_param_values", int, 1000,
           "Per host+path+parameter name, distinct values kept before new ones are dropped "
           "(calendars, session ids).", min=1, max=1 << 30),
        _k("state_bytes", int, 32 * MiB,
           "RAM for the parameter values tracked per host (LRU by host, ~64 bytes per value), bytes.",
           min=64 * KiB, max=1 << 40),
    ]),
    "storage": ("Storage faults: a full disk, a read-only or failing file system pause fetching, never lose a page.", [
        _k("min_free_bytes", int, 256 * MiB,
           "Fetching pauses while the data dir's file system has less free space than this (work in "
           "flight still finishes and is archived); it resumes once there is again.", min=0, max=1 << 40),
        _k("probe_interval_s", float, 5.0,
           "While paused by a storage fault, a test write is tried this often; when it succeeds "
           "fetching resumes (also at once on `crawlerd resume`), seconds.", min=0.1, max=600.0),
        _k("lmdb_write_buffer_bytes", int, 8 * MiB,
           "Page buffers each LMDB store with large write transactions (frontier, recrawl, budgets, DUST, "
           "digest set) "
           "reserves when it opens, bytes (the budget store, which writes most, twice this). LMDB (opened without writemap, so a full disk is an error, not "
           "a crash) copies each page a transaction changes into such a buffer and keeps them for the "
           "next one: a store's private memory is the most pages one of its transactions changed, which "
           "climbs while its B-trees grow. Reserved at open it is a fixed cost, and each of the five stores "
           "commits early to keep its transactions within it (the budget store at the end of an intake "
           "slice of 512 answers, which may pass it by that slice's pages). 0: none reserved, transactions "
           "unbounded.", min=0, max=1 * GiB),
    ]),
    "warc": ("WARC output.", [
        _k("prefix", str, "crawlerd", "Segment file name prefix."),
        _k("segment_max_bytes", int, 1 * GiB, "Rotate a segment once it is this large, bytes.", min=64 * KiB,
           max=64 * GiB),
        _k("index_sort_buffer_bytes", int, 8 * MiB,
           "CDXJ lines held in RAM when a segment's index is sorted at close (by a child process of the "
           "worker that wrote it; external merge sort beyond this), bytes.", min=64 * KiB, max=4 * GiB),
    ]),
    "process": ("Processing of fetched pages.", [
        _k("workers", int, 0,
           "Processing worker processes in all, shared out evenly among the shards (0: cores - "
           "shards, at least one per shard).", min=0, max=256),
        _k("max_links_per_page", int, 5000, "Links extracted from one page at most.", min=0, max=1_000_000),
        _k("queue_bytes", int, 64 * MiB,
           "RAM for fetched bodies not archived yet (waiting for a worker or in one), bytes: a lease starts "
           "only while they and the transfers going, at the mean body size so far, fit (backpressure on "
           "leasing, never on the transfers already going; nothing is dropped, and with nothing fetched or "
           "going one lease may always start, however large its body). It does not cap the number of "
           "transfers otherwise (fetch.max_in_flight does). `crawlerd stats`: memory.fetched_bodies.",
           min=1 * MiB, max=64 * GiB),
        _k("worker_nice", int, 0,
           "Niceness the processing workers add to the crawl loop's (0: the same). Raising it gives the "
           "latency-bound shard loop the CPU first on a machine shared with other work (workers keep a "
           "share: about a third at +5), at the price of a longer wait between a fetch and its archiving "
           "under contention (the work a kill -9 makes the crawl redo).", min=0, max=19),
        _k("batch_scheduling", bool, True,
           "Run the processing workers and the crawl process's background threads (writer, DRUM, sync, "
           "intake logs, index merge, stall watch) under Linux SCHED_BATCH: the same fair share of CPU, "
           "but a worker or thread woken by the shard loop's hand-over never preempts the loop on its CPU "
           "(pages/s x1.06 on a 2-core box, bench/RESULTS.md). No privilege needed; false: the default "
           "policy. Ignored where the platform has no SCHED_BATCH."),
    ]),
    "malloc": ("glibc malloc in the crawl process and its workers (no effect with another C library; "
               "ARCHITECTURE.md, Memory bounds: the C heap).", [
        _k("trim_interval_s", float, 10.0,
           "Seconds between malloc_trim(0) calls that give free heap pages back to the kernel (0: never). "
           "Between two trims private memory holds what was allocated and freed since the last one, so "
           "a shorter interval bounds the part of RAM that follows the crawl's rate, but each trim runs on "
           "the event loop (its cost: `crawlerd stats`, malloc.trim_ms_max; up to ~0.2 s on an HTTPS "
           "crawl's heap), so more trims mean more loop stalls.", min=0.0, max=3600.0),
        _k("mmap_threshold_bytes", int, 256 * KiB,
           "Crawl process: blocks of this size and more get their own mapping, returned when freed "
           "(glibc M_MMAP_THRESHOLD, fixed so it does not rise after the first large free); the heap top "
           "is trimmed past twice this. Workers keep their own, larger threshold (parse buffers).",
           min=16 * KiB, max=32 * MiB),
        _k("arena_max", int, 4,
           "Crawl process: malloc arenas its threads share at most (glibc M_ARENA_MAX; each can hold up "
           "to 64 MiB of address space).", min=1, max=64),
    ]),
    "control": ("Control socket and status.", [
        _k("socket", str, "", "Unix control socket path (mode 0600). Empty: <data_dir>/control.sock."),
    ]),
    "metrics": ("Prometheus scrape endpoint, served by the daemon (text exposition at /metrics).", [
        _k("listen", str, "",
           "Address to serve /metrics on, \"IP:PORT\" (e.g. \"127.0.0.1:9464\", \"[::1]:9464\"; "
           "port 0: any free port, logged). Empty: off. "
           "Off by default because a TCP port is a machine-wide resource (two daemons on one box would "
           "collide) and any local user can read it, unlike the 0600 control socket; "
           "`crawlerd stats --prometheus` prints the same exposition without a port."),
    ]),
    "log": ("Logging.", [
        _k("level", str, "info", "Log level.", choices=("debug", "info", "warning", "error")),
        _k("events", bool, True, "Write one JSON line per fetch under <data_dir>/events/."),
    ]),
    "cluster": ("Shards on several machines over NATS JetStream (the `cluster` extra). Every node of "
                "a crawl names the same servers, crawl name and crawl.shards (given explicitly).", [
        _k("servers", list, [],
           "NATS servers, \"nats://HOST:PORT\" (any of them; the client finds the rest). Empty: "
           "one machine, no cluster. `crawlerd run --cluster URL[,URL...]` sets it.", item_type=str),
        _k("crawl", str, "crawl",
           "Name of this crawl in the cluster (its stream, consumers and KV buckets; letters, "
           "digits, _ and -)."),
        _k("own", str, "",
           "Shards this node runs: \"0-3\", \"0,2,4\" or \"1-2,5\" (`crawlerd run --own`). Empty: "
           "all of crawl.shards."),
        _k("node", str, "", "This node's name in leases and `cluster status`. Empty: the host name."),
        _k("replicas", int, 3, "JetStream replicas of the hand-off stream and the KV buckets.", min=1, max=5),
        _k("lease_ttl_s", float, 15.0,
           "A shard lease expires this long after its owner's last renewal; a standby may take the "
           "shard then. Longer than a stream leader election (nats-server's raft election timeout "
           "is 4-9 s), so a killed NATS leader does not cost leases.", min=1.0, max=600.0),
        _k("lease_fence_s", float, 10.0,
           "A shard starts no request later than this after its last successful renewal was sent "
           "(fencing; below lease_ttl_s, the difference covers clock rates and request start).",
           min=0.5, max=600.0),
        _k("lease_renew_interval_s", float, 1.0, "Renew the lease this often, seconds (below lease_fence_s).",
           min=0.1, max=60.0),
        _k("standby_wait_s", float, 0.0,
           "A shard whose lease another node holds waits up to this long for it to be released or "
           "to expire (a standby); then its process ends and the family tries again after "
           "lease_ttl_s. 0: ask once.", min=0.0, max=86400.0),
        _k("ack_wait_s", float, 30.0,
           "A hand-off batch delivered and not acknowledged within this is delivered again (a "
           "receiver killed mid-batch).", min=1.0, max=3600.0),
        _k("max_backlog_batches", int, 4096,
           "Batches the stream holds for one shard at most; at this many, senders keep further "
           "batches in their own outbox (backpressure, nothing dropped).", min=1, max=10_000_000),
        _k("dedup_window_s", float, 120.0,
           "The stream drops a batch published again (same source and sequence) within this.",
           min=1.0, max=86400.0),
        _k("ip_turns", bool, True,
           "Per-IP politeness across machines: each IP's owner shard (hash of the IP mod "
           "crawl.shards) gives it to one node at a time, so per_ip_concurrency and ip_delay_s "
           "hold across the cluster. false: per machine only (an IP whose hosts are on k machines "
           "may see k x per_ip_concurrency)."),
        _k("ip_grant_s", float, 5.0,
           "Length of a shard's grant to send to an IP (renewed while it leases there, not while "
           "another node waits for the IP), seconds. A grant never given back (a dead node) frees "
           "its IP fetch.timeout_s after it expires.", min=0.2, max=600.0),
    ]),
}
