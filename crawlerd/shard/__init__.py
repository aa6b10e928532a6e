"""One crawl shard: the stages wired into one event loop, one component per module.

A URL's life in the shard (``crawlerd/frontier/__init__.py`` tells the frontier's side):

Born
    as a seed, a redirect target, an outlink or a sitemap entry. The **intake**
    (``intake.Intake``) normalises and filters it (``url.filter.UrlFilter``; each drop is counted
    under its reason), fingerprints it and submits it to the DRUM seen-set with its record
    (depth, hops, priority, URL) as aux data.
Unique
    DRUM answers come back on the loop in submission order. Duplicates end there; a unique URL
    passes its domain's BEAST budget (or is deferred on disk, not dropped) and is added to the
    frontier (LMDB), and only then are DRUM's answers acknowledged. Due recrawl revisits and
    budget readmissions enter the frontier through the intake too.
Leased
    when its host is due (per-host and per-IP politeness). The **lease runner**
    (``leases.LeaseRunner``) first resolves each new host (DNS cache; the address guard picks
    an allowed address) before the host becomes eligible. A host's first lease is for its
    robots.txt, handled by the **host files** component (``hostfiles.HostFiles``: robots.txt
    with its redirects, 5xx as disallow-all, then the sitemaps it announces); no URL of a host
    is fetched before its robots state is known (RFC 9309).
Fetched
    by curl-multi on this loop, through **outbound** (``outbound.Outbound``), which builds
    every request and lets the address guard veto it; the recrawl validators make it a
    conditional GET.
Processed
    by **answers** (``answers.Answers``): archived by a worker (WARC record, CDXJ, links,
    simhash), exact and near duplicates decided, recrawl state recorded; a redirect's target
    and the outlinks go back to the intake. A fetch event is written for each fetch and each
    drop (``events.FetchEvents``).
Completed
    only after processing: the lease is completed once the answer is archived and its links
    are in the seen-set journal, so a crash fetches the URL again instead of losing it, and
    the host's politeness gap starts after processing.

Backpressure: leasing stops when ``fetch.max_in_flight`` leases are running or the seen-set is
behind; nothing is dropped to make room.

Modules: ``shard`` (the Shard: wiring, the loop, the ordered shutdown), ``intake``, ``leases``
(lease table and runner), ``hostfiles``, ``outbound``, ``answers``, ``events``, ``operations``
(status, reload, checkpoint, the config blocklist), ``tasks`` (the shard's background tasks),
``view`` (the shard's numbers: ``Shard.status`` and ``Shard.memory`` read out).
"""

from crawlerd.shard.intake import decode_aux, encode_aux
from crawlerd.shard.shard import Shard
from crawlerd.shard.storage import data_dir_problem, free_space_problem

__all__ = ["Shard", "data_dir_problem", "decode_aux", "encode_aux", "free_space_problem"]
