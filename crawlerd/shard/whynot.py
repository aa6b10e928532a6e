"""``crawlerd url why URL``: why a URL is not fetched yet, asked of the running daemon.

Every part answers from its own state with bounded work, never by scanning the whole frontier:
the URL filter and the blocklist look at the URL, the seen-set binary-searches its merged key
file (on the DRUM thread), the frontier looks at the leases in flight and walks that one host's
queue, BEAST walks at most that domain's waiting URLs, recrawl and robots.txt look up one key.
The verdict is the first of those that holds the URL, in the order a URL travels.
"""

from __future__ import annotations

from crawlerd.url.canonical import fingerprint, normalize
from crawlerd.url.hosts import host_key, host_of, registered_domain


async def explain(shard, raw_url: str) -> dict:
    """The parts' answers for one URL and a one-line verdict (``shard`` is the running Shard)."""
    url = normalize(raw_url)
    if url is None:
        raise ValueError(f"not a valid http(s) URL: {raw_url!r}")
    fp, hk = fingerprint(url), host_key(url)
    now = shard.clock()
    out: dict = {"url": url, "host": hk, "domain": registered_domain(host_of(url))}
    out["filter"] = shard.intake.url_filter.peek(url)
    out["blocked"] = shard.frontier.is_blocked(host_of(hk))
    seen = await shard.seen.contains([fp])
    out["seen"] = {"in_seen_set": seen[0], "waiting_for_merge": shard.seen.pending}
    fr = shard.frontier.explain(url, hk, now)
    out["frontier"] = fr
    bu = shard.budgets.explain(url, fp) if shard.budgets is not None else None
    out["budgets"] = bu
    rc = shard.recrawl.state(fp)
    out["recrawl"] = None if rc is None else {"fetched_at": rc.fetched_at, "status": rc.status,
                                              "next_visit_at": rc.due_at, "handed_out": rc.handed_out}
    entry = shard.robots.get(hk, now) or shard.robots.stale(hk)
    out["robots"] = None if entry is None else {"allowed": entry.rules.allowed(url), "ok": entry.ok,
                                                "expires_in_s": round(entry.expires_at - now, 1)}
    out["verdict"] = _verdict(out)
    return out


def _verdict(o: dict) -> str:
    fr, bu = o["frontier"], o["budgets"]
    if o["blocked"]:
        return "blocked: its host is on the operator blocklist"
    if o["filter"]:
        return f"dropped by the URL filter: {o['filter']}"
    if "leased" in fr:
        le = fr["leased"]
        return f"being fetched now (attempt {le['attempt']}, lease expires in {le['deadline_in_s']} s)"
    if "queued" in fr:
        q = fr["queued"]
        return (f"queued at {fr['host']}, priority level {q['level']}, {q['ahead_in_level']} ahead of it at that "
                f"level; host {fr['host_state']}" + (f", due in {fr['due_in_s']} s" if "due_in_s" in fr else ""))
    if bu is not None and bu.get("waiting"):
        where = f"position {bu['position']} of its domain's {bu['deferred']} waiting URLs"
        if "expected_queue" in bu:
            where += f", expected to pass in BEAST queue {bu['expected_queue']}"
        if bu.get("on_probation"):
            where += "; on probation (no domain vouches for it yet): it passes when the reader moves on"
        return (f"deferred by its domain's budget (BEAST): {bu['domain']} may pass {bu['budget']} URLs per queue "
                f"(in-degree {bu['indegree']}, {bu['spent']} spent in queue {bu['reader']}, the reader's); {where}")
    if "dead_letter" in fr:
        return f"dead-lettered after its last attempts: {fr['dead_letter']}"
    rc = o["recrawl"]
    if rc is not None:
        return f"fetched (status {rc['status']}); next visit at {rc['next_visit_at']:.0f} (unix time)"
    if o["robots"] is not None and not o["robots"]["allowed"]:
        return "robots.txt disallows it"
    if o["seen"]["in_seen_set"]:
        return ("seen, but neither queued, leased nor deferred: fetched (not kept for recrawl) or dropped; "
                "the event log (events/) names the outcome")
    return ("not seen: no link to it was found yet" +
            (f", or it is among the {o['seen']['waiting_for_merge']} URLs waiting for the seen-set's next merge"
             if o["seen"]["waiting_for_merge"] else ""))
