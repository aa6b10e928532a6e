"""Typed, strict configuration: every key, its default, unit and meaning, in one place.

The schema below is the single source of defaults. ``config.toml`` at the
repository root is generated from it (``crawlerd config dump``) and a test
checks the two agree. Loading is strict: an unknown section or key, a wrong
type or an out-of-range value raises :class:`ConfigError` whose message names
the file, the key, the value and what was expected; the CLI prints that one
line and exits 2.

Units are part of the key names (``_s`` seconds, ``_bytes`` bytes).
Keys marked ``runtime`` are re-read on SIGHUP; all others are fixed for the
life of the process.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import tomllib
from dataclasses import dataclass
from typing import Any

PLACEHOLDER_CONTACT = "CHANGE-ME"


class ConfigError(Exception):
    """A bad config file or override; the message is one line and names the key."""


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
           "chosen at the crawl's first start from the core count (cores // 8, at least 1: one "
           "shard loop keeps about 7 cores of processing workers busy, bench/shards_bench.py). "
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
        _k("map_size_bytes", int, 64 * GiB, "LMDB map size for the frontier (address space, not RAM).",
           min=16 * MiB, max=MAX_MAP_BYTES),
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
           "short, else every second).", min=1, max=10_000_000),
        _k("cache_entries", int, 65536, "Domains whose budget and in-degree records are cached in RAM (LRU).",
           min=16, max=1 << 30),
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
        _k("max_decoded_bytes", int, 20 * MiB, "Largest body after content decoding (bomb guard).", min=1 * KiB,
           max=4 * GiB),
        _k("max_header_bytes", int, 64 * KiB, "Largest response header block (headers_too_large).", min=1 * KiB,
           max=16 * MiB),
        _k("max_url_length", int, 2048, "Longest URL fetched or queued, bytes.", min=64, max=16384),
        _k("max_redirects", int, 5, "Redirect hops followed (each hop is a new URL through the frontier).",
           min=0, max=20),
        _k("max_connections", int, 2000, "Connection cache size of the curl multi handle.", min=1, max=1_000_000),
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
           "Keys waiting in RAM for the DRUM thread (during a merge) before leasing pauses; never dropped.",
           min=1, max=1 << 30),
    ]),
    "dedup": ("Content de-duplication.", [
        _k("simhash_distance", int, 3, "Near-duplicate when simhashes differ in at most this many bits.",
           min=0, max=3),
        _k("near_dup_demote_ratio", float, 0.5,
           "A host whose recent pages are at least this share near-duplicates drops in priority.", min=0.0, max=1.0),
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
        _k("cache_hosts", int, 2048, "Host records kept decoded in RAM.", min=16, max=1 << 20),
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
        _k("max_hosts", int, 4096, "Hosts whose parameter values are tracked (LRU).", min=1, max=1 << 24),
        _k("max_tracked_values", int, 500000, "Parameter values remembered in all (bounds RAM).", min=1, max=1 << 30),
    ]),
    "storage": ("Storage faults: a full disk, a read-only or failing file system pause fetching, never lose a page.", [
        _k("min_free_bytes", int, 256 * MiB,
           "Fetching pauses while the data dir's file system has less free space than this (work in "
           "flight still finishes and is archived); it resumes once there is again.", min=0, max=1 << 40),
        _k("probe_interval_s", float, 5.0,
           "While paused by a storage fault, a test write is tried this often; when it succeeds "
           "fetching resumes (also at once on `crawlerd resume`), seconds.", min=0.1, max=600.0),
    ]),
    "warc": ("WARC output.", [
        _k("prefix", str, "crawlerd", "Segment file name prefix."),
        _k("segment_max_bytes", int, 1 * GiB, "Rotate a segment once it is this large, bytes.", min=64 * KiB,
           max=64 * GiB),
        _k("index_sort_buffer_bytes", int, 8 * MiB,
           "CDXJ lines held in RAM per worker when a segment's index is sorted at close (external merge "
           "sort beyond this), bytes.", min=64 * KiB, max=4 * GiB),
    ]),
    "process": ("Processing of fetched pages.", [
        _k("workers", int, 0,
           "Processing worker processes in all, shared out evenly among the shards (0: cores - "
           "shards, at least one per shard).", min=0, max=256),
        _k("max_links_per_page", int, 5000, "Links extracted from one page at most.", min=0, max=1_000_000),
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
}


class Section:
    """Attribute access to one section's values (``cfg.fetch.timeout_s``)."""

    __slots__ = ("_name", "_values")

    def __init__(self, name: str, values: dict[str, Any]):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_values", values)

    def __getattr__(self, key: str) -> Any:
        try:
            return self._values[key]
        except KeyError:
            raise AttributeError(f"config section [{self._name}] has no key {key!r}") from None

    def __setattr__(self, key, value):  # pragma: no cover - guard
        raise AttributeError("config is read-only")

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)


class Config:
    """A validated configuration: ``cfg.<section>.<key>``."""

    def __init__(self, values: dict[str, dict[str, Any]], source: str = "<defaults>"):
        self._values = values
        self.source = source
        for name, vals in values.items():
            setattr(self, name, Section(name, vals))

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {s: dict(v) for s, v in self._values.items()}

    # derived paths -------------------------------------------------------
    @property
    def control_socket(self) -> str:
        return self.control.socket or os.path.join(self.crawl.data_dir, "control.sock")

    def path(self, *parts: str) -> str:
        return os.path.join(self.crawl.data_dir, *parts)

    def contact_is_placeholder(self) -> bool:
        return PLACEHOLDER_CONTACT in self.crawl.user_agent

    def contact_problem(self) -> str | None:
        """Why ``crawl.user_agent`` cannot be sent on a real crawl, or None.

        Webmasters must be able to reach the operator: the agent has to carry a
        URL (``+https://...``) or an e-mail address, and not the shipped placeholder.
        """
        ua = self.crawl.user_agent
        if PLACEHOLDER_CONTACT in ua:
            return (f"crawl.user_agent still has the placeholder operator contact ({PLACEHOLDER_CONTACT}); "
                    "set a real contact before crawling")
        if not _CONTACT.search(ua):
            return (f"crawl.user_agent = {ua!r}: expected an operator contact in it, a URL (+https://...) "
                    "or an e-mail address")
        return None


def defaults() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for section, (_doc, keys) in SCHEMA.items():
        out[section] = {k.name: _copy(k.default) for k in keys}
    return out


def _copy(v):
    if isinstance(v, list):
        return list(v)
    if isinstance(v, dict):
        return dict(v)
    return v


def _type_name(t) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
             list: "a list", dict: "a table"}
    return names.get(t, t.__name__)


def _bound(key: Key, v: float) -> str:
    return str(int(v)) if key.type is int else f"{v:g}"


def _check(key: Key, where: str, value: Any) -> Any:
    """Return the value coerced to the key's type, or raise ConfigError naming the key."""
    def bad(expected: str):
        raise ConfigError(f"{where}: {key.name} = {value!r}: expected {expected}")

    t = key.type
    if t is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            bad(_type_name(float))
        value = float(value)
        if not math.isfinite(value):        # nan compares false with every bound: refuse it first
            bad("a finite number")
    elif t is int:
        if isinstance(value, bool) or not isinstance(value, int):
            bad(_type_name(int))
    elif t is bool:
        if not isinstance(value, bool):
            bad(_type_name(bool))
    elif t is str:
        if not isinstance(value, str):
            bad(_type_name(str))
    elif t is list:
        if not isinstance(value, list):
            bad(f"a list of {_type_name(key.item_type)}s" if key.item_type else "a list")
        if key.item_type and not all(isinstance(x, key.item_type) for x in value):
            bad(f"a list of {_type_name(key.item_type).split(' ', 1)[1]}s")
        value = list(value)
    elif t is dict:
        if not isinstance(value, dict):
            bad("a table")
        if key.item_type and not all(isinstance(x, key.item_type) for x in value.values()):
            bad(f"a table of {_type_name(key.item_type).split(' ', 1)[1]}s")
        value = dict(value)
    if key.min is not None and value < key.min:
        bad(f"a value >= {_bound(key, key.min)}")
    if key.max is not None and value > key.max:
        bad(f"a value <= {_bound(key, key.max)}")
    if key.choices is not None and value not in key.choices:
        bad("one of " + ", ".join(key.choices))
    _check_special(key, where, value)
    return value


_TOKEN = re.compile(r"[A-Za-z_-]+")              # RFC 9309 §2.2.1 product token
_FILE_WORD = re.compile(r"[A-Za-z0-9._-]+")
_PRINTABLE = re.compile(r"[\x20-\x7e]*")          # an HTTP header value we send as is
_CONTACT = re.compile(r"https?://[^\s/()<>;]+|[^\s@()<>;:]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*")
UNIX_SOCKET_MAX_BYTES = 107                      # sun_path is 108 bytes with its NUL (Linux)


def _check_special(key: Key, where: str, value: Any) -> None:
    name = f"{where}: {key.name} = {value!r}"
    if key.name == "user_agent":
        if not value.strip() or not _PRINTABLE.fullmatch(value):
            raise ConfigError(f"{name}: expected printable ASCII text (it is sent as the User-Agent header)")
    elif key.name == "agent_token":
        if not _TOKEN.fullmatch(value):
            raise ConfigError(f"{name}: expected a product token of letters, '_' and '-' (RFC 9309 §2.2.1)")
    elif key.name == "data_dir":
        if not value.strip() or "\0" in value:
            raise ConfigError(f"{name}: expected a directory path")
    elif key.name == "prefix":
        if not _FILE_WORD.fullmatch(value):
            raise ConfigError(f"{name}: expected a file name part of letters, digits, '.', '_' and '-'")
    elif key.name == "socket":
        if "\0" in value or len(os.fsencode(value)) > UNIX_SOCKET_MAX_BYTES:
            raise ConfigError(f"{name}: expected a path of at most {UNIX_SOCKET_MAX_BYTES} bytes "
                              "(the limit of a Unix socket address)")
    elif key.name == "urls":
        for u in value:
            if not u.startswith(("http://", "https://")):
                raise ConfigError(f"{name}: {u!r} is not an http(s) URL")
    elif key.name == "allow":
        for net in value:
            try:
                ipaddress.ip_network(net, strict=False)
            except ValueError:
                raise ConfigError(f"{name}: {net!r} is not a network in CIDR form (e.g. \"127.0.0.0/8\")") from None
    elif key.name == "nameservers":
        for ns in value:
            host, _, port = ns.rpartition(":") if ns.count(":") == 1 else (ns, "", "")
            try:
                ipaddress.ip_address(host or ns)
                if port and not (0 < int(port) < 65536):
                    raise ValueError
            except ValueError:
                raise ConfigError(f"{name}: {ns!r} is not \"IP\" or \"IP:PORT\"") from None
    elif key.name == "host_concurrency":
        for host, n in value.items():
            if "://" not in host or not 1 <= n <= 255:
                raise ConfigError(f"{name}: {host!r} = {n!r}: expected \"scheme://host[:port]\" = 1..255")
    elif key.name == "ca_file" and value:
        if not os.path.isfile(value) or not os.access(value, os.R_OK):
            raise ConfigError(f"{name}: not a readable file (expected a PEM file of CA certificates)")
    elif key.name == "listen" and value:
        try:
            parse_listen(value)
        except ValueError as e:
            raise ConfigError(f"{name}: {e}") from None
    elif key.name == "static_hosts":
        for host, ip in value.items():
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise ConfigError(f"{name}: {host!r} maps to {ip!r}, which is not an IP address") from None


def parse_listen(text: str) -> tuple[str, int]:
    """``"IP:PORT"`` or ``"[IPv6]:PORT"`` -> (ip, port); ValueError naming the expected form otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep:
        raise ValueError('expected "IP:PORT" (e.g. "127.0.0.1:9464" or "[::1]:9464")')
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f'an IPv6 address goes in brackets: "[{host}]:{port}"')
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f'{host!r} is not an IP address (expected "IP:PORT", e.g. "127.0.0.1:9464")') from None
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"port {port!r} is not 0..65535")
    return str(ip), int(port)


_KEYS = {section: {k.name: k for k in keys} for section, (_d, keys) in SCHEMA.items()}


def _apply(values: dict, data: dict, source: str) -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a table of sections")
    for section, table in data.items():
        if section not in _KEYS:
            raise ConfigError(f"{source}: unknown section [{section}]: expected one of "
                              + ", ".join(_KEYS))
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: [{section}] must be a table, got {table!r}")
        for key, value in table.items():
            spec = _KEYS[section].get(key)
            if spec is None:
                raise ConfigError(f"{source}: unknown key {section}.{key}: [{section}] has "
                                  + ", ".join(_KEYS[section]))
            values[section][key] = _check(spec, f"{source}: {section}", value)


def parse_override(text: str) -> tuple[str, str, Any]:
    """Parse ``section.key=VALUE`` (VALUE as TOML, else a plain string)."""
    if "=" not in text:
        raise ConfigError(f"-s {text!r}: expected section.key=VALUE")
    dotted, raw = text.split("=", 1)
    dotted = dotted.strip()
    if dotted.count(".") != 1:
        raise ConfigError(f"-s {text!r}: expected section.key=VALUE (e.g. fetch.timeout_s=30)")
    section, key = dotted.split(".")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return section, key, value


def load(path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load defaults, then the TOML file (if any), then ``-s`` overrides; validate all."""
    values = defaults()
    source = "<defaults>"
    if path:
        source = path
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except OSError as e:
            raise ConfigError(f"{path}: cannot read config file: {e.strerror}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: not UTF-8 at byte {e.start}") from None
        _apply(values, data, path)
    for text in overrides:
        section, key, value = parse_override(text)
        _apply(values, {section: {key: value}}, "-s")
    cross = values["politeness"]
    if cross["min_delay_s"] > cross["max_delay_s"]:
        raise ConfigError(f"{source}: politeness.min_delay_s = {cross['min_delay_s']!r}: expected a value "
                          f"<= politeness.max_delay_s ({cross['max_delay_s']!r})")
    b = values["budgets"]
    if b["max_budget"] < b["base_budget"]:
        raise ConfigError(f"{source}: budgets.max_budget = {b['max_budget']!r}: expected a value >= "
                          f"budgets.base_budget ({b['base_budget']!r})")
    if b["max_spread"] & (b["max_spread"] - 1):
        raise ConfigError(f"{source}: budgets.max_spread = {b['max_spread']!r}: expected a power of two")
    r = values["recrawl"]
    if not r["min_interval_s"] <= r["initial_interval_s"] <= r["max_interval_s"]:
        raise ConfigError(f"{source}: recrawl.initial_interval_s = {r['initial_interval_s']!r}: expected "
                          f"min_interval_s ({r['min_interval_s']!r}) <= it <= max_interval_s ({r['max_interval_s']!r})")
    n = values["politeness"]["shared_ip_slots"]
    if n & (n - 1):
        raise ConfigError(f"{source}: politeness.shared_ip_slots = {n!r}: expected a power of two")
    f = values["fetch"]
    if f["connect_timeout_s"] > f["timeout_s"]:
        raise ConfigError(f"{source}: fetch.connect_timeout_s = {f['connect_timeout_s']!r}: expected a value "
                          f"<= fetch.timeout_s ({f['timeout_s']!r})")
    if cross["backoff_base_s"] > cross["backoff_max_s"]:
        raise ConfigError(f"{source}: politeness.backoff_base_s = {cross['backoff_base_s']!r}: expected a value "
                          f"<= politeness.backoff_max_s ({cross['backoff_max_s']!r})")
    if r["priority"] >= values["frontier"]["priority_levels"]:
        raise ConfigError(f"{source}: recrawl.priority = {r['priority']!r}: expected a value < "
                          f"frontier.priority_levels ({values['frontier']['priority_levels']!r})")
    d = values["dns"]
    if d["min_ttl_s"] > d["max_ttl_s"]:
        raise ConfigError(f"{source}: dns.min_ttl_s = {d['min_ttl_s']!r}: expected a value <= dns.max_ttl_s")
    return Config(values, source)


# -- limits of this machine, checked when a crawl starts --------------------------------

# The content-dedup LMDB maps (exact digests, near-duplicate index) are not configurable: 64 GiB each.
FIXED_MAP_BYTES = 2 * 64 * GiB


def map_size_keys(cfg: Config) -> list[tuple[str, int]]:
    """Every configured LMDB map size the crawl opens, as (dotted key, bytes)."""
    keys = [("frontier.map_size_bytes", cfg.frontier.map_size_bytes),
            ("recrawl.map_size_bytes", cfg.recrawl.map_size_bytes)]
    if cfg.budgets.enabled:
        keys.append(("budgets.map_size_bytes", cfg.budgets.map_size_bytes))
    return keys


def check_map_sizes(cfg: Config) -> None:
    """Raise ConfigError when the LMDB maps do not fit in the address space this process may map.

    An LMDB environment maps its whole ``map_size`` at open, so all maps together must fit
    under RLIMIT_AS and the kernel's user address space. The second is probed by reserving
    the total as one inaccessible, unbacked mapping (no memory is committed).
    """
    import mmap
    import resource
    keys = map_size_keys(cfg)
    total = sum(n for _k, n in keys) + FIXED_MAP_BYTES
    name, biggest = max(keys, key=lambda kv: kv[1])
    head = f"{cfg.source}: {name} = {biggest}: the LMDB maps need {total} bytes of address space in all"
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and total > soft:
        raise ConfigError(f"{head}, more than the RLIMIT_AS of {soft} bytes; lower the map sizes")
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000)
    try:
        mmap.mmap(-1, total, flags=flags, prot=0).close()
    except (OSError, OverflowError, ValueError):
        raise ConfigError(f"{head}, more than this machine lets a process map; lower the map sizes") from None


# -- the shipped config.toml ------------------------------------------------

def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_value(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def _wrap(text: str, width: int = 88) -> list[str]:
    words, lines, cur = text.split(), [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    if cur:
        lines.append(cur)
    return lines


def render_toml() -> str:
    """The documented config file: every key with its default, unit and meaning."""
    out = ["# crawlerd configuration. Every key is listed with its default value.",
           "# Units are in the key names: _s = seconds, _bytes = bytes.",
           "# Keys marked (runtime) are re-read on SIGHUP / `systemctl reload crawlerd`;",
           "# all others are fixed when the daemon starts.",
           "# Generated by `crawlerd config dump`; a test checks it matches the code.", ""]
    for section, (doc, keys) in SCHEMA.items():
        out.append(f"# {doc}")
        out.append(f"[{section}]")
        for k in keys:
            text = k.doc + (" (runtime)" if k.runtime else "")
            if k.min is not None or k.max is not None:
                lo = "" if k.min is None else _bound(k, k.min)
                hi = "" if k.max is None else _bound(k, k.max)
                text += f" Range: [{lo}, {hi}]."
            out.extend("# " + line for line in _wrap(text))
            out.append(f"{k.name} = {_toml_value(k.default)}")
        out.append("")
    return "\n".join(out)
