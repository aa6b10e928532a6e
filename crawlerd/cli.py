"""Command line: one small function per verb.

Exit codes: 0 success, 1 runtime failure, 2 bad usage / config / input,
3 no daemon running (status, stats and the other control verbs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from crawlerd import __version__
from crawlerd import config as configmod
from crawlerd.readout import print_stats, print_status

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_NO_DAEMON = 0, 1, 2, 3


class UsageError(Exception):
    pass


# -- helpers ------------------------------------------------------------------------
def _load_config(args, extra: list[str] = ()) -> configmod.Config:
    overrides = list(args.set or []) + list(extra)
    if getattr(args, "data_dir", None):
        overrides.append(f"crawl.data_dir={json.dumps(args.data_dir)}")
    return configmod.load(args.config, overrides)


def _seconds(text: str | float | None, flag: str, *, zero_ok: bool = False) -> float | None:
    """A command-line duration: a finite number of seconds > 0 (>= 0 with zero_ok), or None if absent."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise UsageError(f"{flag} {text!r}: expected a number of seconds {'>=' if zero_ok else '>'} 0")
    return value


def _ask(args, cmd: str, **kw) -> dict:
    from crawlerd import control
    cfg = _load_config(args)
    reply = control.request(cfg.control_socket, cmd, **kw)
    if not reply.get("ok"):
        raise UsageError(reply.get("error", "request failed"))
    return reply


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))


# -- verbs ----------------------------------------------------------------------------
def _cluster_flags(args) -> None:
    """``--cluster``, ``--shards``, ``--own``: the config keys they stand for, as ``-s`` overrides
    (so a family passes them on to its shard processes)."""
    extra = []
    if getattr(args, "cluster", None):
        servers = [s.strip() for s in args.cluster.split(",") if s.strip()]
        extra.append(f"cluster.servers={json.dumps(servers)}")
    if getattr(args, "shards", None) is not None:
        extra.append(f"crawl.shards={args.shards}")
    if getattr(args, "own", None):
        extra.append(f"cluster.own={json.dumps(args.own)}")
    args.set = list(args.set or []) + extra


def cmd_run(args) -> int:
    from crawlerd.supervisor import Supervisor, setup_logging
    _cluster_flags(args)
    cfg = _load_config(args)
    duration = _seconds(args.duration, "--duration")
    problem = cfg.contact_problem()
    if problem:
        raise UsageError(f"{cfg.source}: {problem}")
    configmod.check_map_sizes(cfg)
    if cfg.cluster.servers and cfg.crawl.shards < 1:
        raise UsageError(f"{cfg.source}: crawl.shards = {cfg.crawl.shards}: a cluster crawl (cluster.servers set) "
                         "needs the shard count given explicitly, the same on every node (--shards N)")
    if args.member is not None:         # one shard of a family, started by the family supervisor
        setup_logging(cfg.log.level, tag=f"shard={args.member}")
        sup = Supervisor(cfg, config_path=args.config, overrides=list(args.set or []), member=args.member)
    else:
        from crawlerd import layout
        try:
            n = layout.resolve_shards(cfg.crawl.data_dir, cfg.crawl.shards)
        except layout.LayoutError as e:
            raise UsageError(str(e)) from None
        if n != cfg.crawl.shards:
            cfg = _load_config(args, [f"crawl.shards={n}"])
        setup_logging(cfg.log.level)
        seeds = [args.seeds] if args.seeds else []
        if n > 1 or cfg.cluster.servers:
            from crawlerd.family import Family
            sup = Family(cfg, seeds_files=seeds, duration_s=duration, config_path=args.config,
                         overrides=list(args.set or []))
        else:
            sup = Supervisor(cfg, seeds_files=seeds, duration_s=duration, config_path=args.config,
                             overrides=list(args.set or []))
    try:
        return sup.run()
    finally:
        sup.close()


def cmd_cluster_status(args) -> int:
    import asyncio

    from crawlerd.cluster.engine import ClusterError, Link, Names
    from crawlerd.cluster.status import gather, render
    _cluster_flags(args)
    cfg = _load_config(args)
    if not cfg.cluster.servers:
        raise UsageError("cluster.servers is empty: name the NATS servers (--cluster nats://HOST:PORT[,...])")

    async def ask() -> dict:
        link = Link(cfg.cluster.servers, Names(cfg.cluster.crawl), name="crawlerd-status")
        await link.open(timeout_s=args.timeout)
        try:
            return await gather(link, shards=cfg.crawl.shards or None)
        finally:
            await link.close()
    try:
        view = asyncio.run(ask())
    except ClusterError as e:
        raise UsageError(str(e)) from None
    if args.json:
        _print_json(view)
    else:
        print(render(view))
    return EXIT_OK


def cmd_demo(args) -> int:
    from crawlerd.demo import run_demo
    _seconds(str(args.seconds), "--seconds")
    if not 1 <= args.hosts <= 1_000_000:
        raise UsageError(f"--hosts {args.hosts}: expected 1..1000000 synthetic hosts")
    return run_demo(args)


def _shard_arg(args) -> dict:
    return {"shard": args.shard} if getattr(args, "shard", None) is not None else {}


def cmd_status(args) -> int:
    s = _ask(args, "status", **_shard_arg(args))
    if args.json:
        _print_json(s)
        return EXIT_OK
    print_status(s)
    return EXIT_OK


def cmd_stats(args) -> int:
    _seconds(str(args.interval), "--interval")
    if args.prometheus:
        sys.stdout.write(_ask(args, "metrics", **_shard_arg(args))["text"])
        return EXIT_OK
    while True:
        s = _ask(args, "stats", **_shard_arg(args))
        if args.json:
            _print_json(s)
        else:
            print_stats(s)
        if not args.watch:
            return EXIT_OK
        time.sleep(args.interval)
        print()


def cmd_top(args) -> int:
    from crawlerd.top import run_top
    if args.interval <= 0:
        raise UsageError(f"--interval {args.interval:g}: expected a positive number of seconds")
    return run_top(lambda: _ask(args, "stats"), interval_s=args.interval)


def cmd_report(args) -> int:
    from crawlerd.report import write_report
    cfg = _load_config(args)
    try:
        path = write_report(cfg.crawl.data_dir, args.output, min_delay_s=cfg.politeness.min_delay_s)
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"cannot write {args.output}: {e.strerror}") from None
    print(path)
    return EXIT_OK


def cmd_seed_add(args) -> int:
    from crawlerd.startup import read_seeds
    urls: list[str] = []
    invalid = 0
    for item in args.items:
        if "://" in item:
            urls.append(item)
        else:
            good, bad = read_seeds(item)
            urls += good
            invalid += bad
    r = _ask(args, "seed_add", urls=urls)
    print(f"submitted {r['submitted']} seeds, {r['invalid'] + invalid} invalid skipped")
    return EXIT_OK


def cmd_block(args) -> int:
    if args.action == "list":
        r = _ask(args, "block_list")
    else:
        if not args.patterns:
            raise UsageError(f"block {args.action}: name at least one HOST or DOMAIN")
        for pat in args.patterns:
            r = _ask(args, f"block_{args.action}", pattern=pat)
    for pat in r["blocked"]:
        print(pat)
    return EXIT_OK


def _simple(cmd: str):
    def run(args) -> int:
        r = _ask(args, cmd)
        print(r.get("state") or ("checkpoint written" if r.get("checkpointed") else "ok"))
        return EXIT_OK
    return run


def cmd_robots_check(args) -> int:
    from crawlerd.fetch.robots import check_lines
    cfg = _load_config(args)
    agent = args.agent or cfg.robots.agent_token
    if args.robots:
        try:
            with open(args.robots, "rb") as f:
                body = f.read()
        except OSError as e:
            raise UsageError(f"cannot read robots file {args.robots}: {e.strerror}") from None
        for line in check_lines(body, agent, args.urls):
            print(line)
        return EXIT_OK
    from crawlerd.fetch.robots_online import RobotsCheckError, check_online
    try:
        lines = check_online(cfg, args.robots_url, agent, args.urls)
    except RobotsCheckError as e:
        raise UsageError(str(e)) from None
    for line in lines:
        print(line)
    return EXIT_OK


def cmd_url_normalize(args) -> int:
    from crawlerd.url.canonical import normalize
    rc = EXIT_OK
    for u in args.urls:
        n = normalize(u)
        if n is None:
            print(f"crawlerd: error: not a valid http(s) URL: {u!r}", file=sys.stderr)
            rc = EXIT_USAGE
        else:
            print(n)
    return rc


def cmd_url_why(args) -> int:
    for u in args.urls:
        r = _ask(args, "url_why", url=u)
        if args.json:
            _print_json(r)
            continue
        print(f"{r['url']}: {r['verdict']}")
        fr, bu = r["frontier"], r["budgets"]
        print(f"  seen-set: {'seen' if r['seen']['in_seen_set'] else 'not in the merged set'} "
              f"({r['seen']['waiting_for_merge']} URLs wait for its next merge)")
        print(f"  frontier: host {fr['host_state']}" + (f", due in {fr['due_in_s']} s" if "due_in_s" in fr else "")
              + (f", levels queued {fr['levels_queued']}" if fr.get("levels_queued") else ""))
        if bu:
            print(f"  budget:   {bu['domain']} in-degree {bu['indegree']}, budget {bu['budget']} per queue, "
                  f"spent {bu['spent']}, {bu['deferred']} deferred, reader on queue {bu['reader']}")
    return EXIT_OK


def cmd_warc_verify(args) -> int:
    from crawlerd.store.cdxj import cdxj_path
    from crawlerd.store.verify import verify
    rc = EXIT_OK
    for path in args.files:
        index = cdxj_path(path, args.index_dir) if args.index_dir else None
        rep = verify(path, index_path=index, check_index=not args.no_index)
        for line in rep.lines():
            print(line)
        if not rep.ok:
            rc = EXIT_FAIL
    return rc


def cmd_warc_index(args) -> int:
    from crawlerd.store.cdxj import cdxj_path, iter_lines, write_index
    from crawlerd.store.verify import file_problem, find_index
    rc = EXIT_OK
    for path in args.files:
        problem = file_problem(path)
        if problem:
            print(f"crawlerd: error: {path}: {problem}", file=sys.stderr)
            rc = EXIT_FAIL
            continue
        try:
            if args.stdout:
                for line in sorted(set(iter_lines(path)), key=str.encode):
                    print(line)
                continue
            target = cdxj_path(path, args.index_dir) if args.index_dir else (find_index(path) or cdxj_path(path))
            os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
            n = write_index(path, target)
        except OSError as e:
            print(f"crawlerd: error: {path}: {e.strerror or e}", file=sys.stderr)
            rc = EXIT_FAIL
            continue
        print(f"{target}: {n} lines")
    return rc


def cmd_config_dump(args) -> int:
    sys.stdout.write(configmod.render_toml())
    return EXIT_OK


def cmd_config_check(args) -> int:
    cfg = _load_config(args)
    print(f"{cfg.source}: ok")
    return EXIT_OK


# -- parser ------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="PATH", help="config file (TOML); default: built-in defaults")
    common.add_argument("-s", "--set", action="append", metavar="SECTION.KEY=VALUE",
                        help="override a config key; VALUE is TOML (e.g. -s 'network.allow=[\"127.0.0.0/8\"]'), "
                             "else a string; repeatable")
    fmt = argparse.ArgumentDefaultsHelpFormatter
    p = argparse.ArgumentParser(prog="crawlerd", formatter_class=fmt,
                                description="crawlerd: a single-server, high-throughput, polite web crawler daemon.",
                                epilog="Exit codes: 0 ok, 1 failure, 2 bad usage/config/input, 3 no daemon running.")
    p.add_argument("--version", action="version", version=f"crawlerd {__version__}")
    sub = p.add_subparsers(dest="verb", metavar="COMMAND", required=True)

    def add(name, func, help_, parents=(common,)):
        sp = sub.add_parser(name, help=help_, description=help_, parents=list(parents), formatter_class=fmt)
        sp.set_defaults(func=func)
        return sp

    r = add("run", cmd_run, "run the crawler in the foreground (systemd ExecStart)")
    r.add_argument("--seeds", metavar="FILE", help="seed URLs, one per line")
    r.add_argument("--data-dir", metavar="DIR", help="overrides crawl.data_dir")
    r.add_argument("--duration", metavar="SECONDS", help="stop after this many seconds (> 0; default: run until stopped)")
    r.add_argument("--member", type=int, metavar="I", help=argparse.SUPPRESS)    # a family's shard I
    r.add_argument("--cluster", metavar="URL[,URL...]",
                   help="run as a node of a cluster: NATS servers nats://HOST:PORT (cluster.servers)")
    r.add_argument("--shards", type=int, metavar="N", help="the crawl's shard count (crawl.shards)")
    r.add_argument("--own", metavar="SET", help="the shards this node runs, e.g. 0-3 or 0,2,4 (cluster.own)")

    d = add("demo", cmd_demo, "start the bundled synthetic web on loopback and crawl it, with live progress")
    d.add_argument("--seconds", type=float, default=60.0, help="how long to crawl, seconds (> 0)")
    d.add_argument("--hosts", type=int, default=300, help="synthetic hosts")
    d.add_argument("--data-dir", metavar="DIR", help="where to keep the demo crawl (default: a temp dir)")
    d.add_argument("--no-netns", action="store_true", help="do not enter a private network namespace")
    d.add_argument("--inside-netns", action="store_true", help=argparse.SUPPRESS)

    st = add("status", cmd_status, "one screen: state, uptime, rates, queues, errors")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.add_argument("--data-dir", metavar="DIR", help="overrides crawl.data_dir (locates the control socket)")
    st.add_argument("--shard", type=int, metavar="I", help="one shard's own status (crawl.shards > 1)")
    ss = add("stats", cmd_stats, "detailed counters: outcomes, statuses, drops, top hosts")
    ss.add_argument("--json", action="store_true", help="machine-readable output")
    ss.add_argument("--watch", action="store_true", help="repeat until interrupted")
    ss.add_argument("--prometheus", action="store_true",
                    help="print the Prometheus text exposition (for a textfile collector)")
    ss.add_argument("--interval", type=float, default=2.0,  help="seconds between --watch updates")
    ss.add_argument("--data-dir", metavar="DIR", help="overrides crawl.data_dir (locates the control socket)")
    ss.add_argument("--shard", type=int, metavar="I", help="one shard's own stats (crawl.shards > 1)")

    tp = add("top", cmd_top, "live terminal view of a running crawl (q or Ctrl-C quits)")
    tp.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    tp.add_argument("--data-dir", metavar="DIR", help="overrides crawl.data_dir (locates the control socket)")
    rp = add("report", cmd_report, "write a self-contained HTML crawl report (charts) from the event logs")
    rp.add_argument("-o", "--output", metavar="FILE", default="report.html", help="the HTML file to write")
    rp.add_argument("--data-dir", metavar="DIR", help="overrides crawl.data_dir (the crawl to report on)")

    seed = sub.add_parser("seed", help="add seeds to a running crawl", formatter_class=fmt)
    seed_sub = seed.add_subparsers(dest="seed_verb", metavar="ACTION", required=True)
    sa = seed_sub.add_parser("add", help="add seed URLs or files of URLs", parents=[common], formatter_class=fmt)
    sa.add_argument("items", nargs="+", metavar="URL|FILE")
    sa.add_argument("--data-dir", metavar="DIR", help="overrides crawl.data_dir (locates the control socket)")
    sa.set_defaults(func=cmd_seed_add)

    b = add("block", cmd_block, "operator blocklist: add, remove or list hosts/domains (effective at once)")
    b.add_argument("action", choices=["add", "remove", "list"])
    b.add_argument("patterns", nargs="*", metavar="HOST|DOMAIN")
    b.add_argument("--data-dir", metavar="DIR", help="overrides crawl.data_dir (locates the control socket)")

    for verb, help_ in (("pause", "stop starting new fetches"), ("resume", "start fetching again"),
                        ("checkpoint", "flush the seen-set and commit the frontier now"),
                        ("stop", "ordered shutdown of the running daemon")):
        sp = add(verb, _simple(verb), help_)
        sp.add_argument("--data-dir", metavar="DIR", help="overrides crawl.data_dir (locates the control socket)")

    rob = sub.add_parser("robots", help="robots.txt tools", formatter_class=fmt)
    rob_sub = rob.add_subparsers(dest="robots_verb", metavar="ACTION", required=True)
    rc = rob_sub.add_parser("check", help="print 'allow URL' or 'disallow URL' per URL (RFC 9309)",
                            parents=[common], formatter_class=fmt)
    src = rc.add_mutually_exclusive_group(required=True)
    src.add_argument("--robots", metavar="FILE", help="a robots.txt file")
    src.add_argument("--robots-url", metavar="URL", help="fetch robots.txt through the crawler's fetch path")
    rc.add_argument("--agent", metavar="TOKEN", help="product token (default: robots.agent_token)")
    rc.add_argument("urls", nargs="+", metavar="URL")
    rc.set_defaults(func=cmd_robots_check)

    u = sub.add_parser("url", help="URL tools", formatter_class=fmt)
    u_sub = u.add_subparsers(dest="url_verb", metavar="ACTION", required=True)
    un = u_sub.add_parser("normalize", help="print one normalised URL per line", parents=[common],
                          formatter_class=fmt)
    un.add_argument("urls", nargs="+", metavar="URL")
    un.set_defaults(func=cmd_url_normalize)
    uw = u_sub.add_parser("why", help="ask the running daemon why a URL is not fetched yet (seen? queued where? "
                          "deferred by its budget? dropped? leased?)", parents=[common], formatter_class=fmt)
    uw.add_argument("urls", nargs="+", metavar="URL")
    uw.add_argument("--json", action="store_true", help="machine-readable output")
    uw.add_argument("--data-dir", metavar="DIR", help="overrides crawl.data_dir (locates the control socket)")
    uw.set_defaults(func=cmd_url_why)

    w = sub.add_parser("warc", help="WARC tools", formatter_class=fmt)
    w_sub = w.add_subparsers(dest="warc_verb", metavar="ACTION", required=True)
    wv = w_sub.add_parser("verify", help="validate segments: records whole, digests, record order, the CDXJ; "
                          "exit 1 on any failure", parents=[common], formatter_class=fmt)
    wv.add_argument("files", nargs="+", metavar="FILE")
    wv.add_argument("--index-dir", metavar="DIR",
                    help="where the CDXJ files are (default: ../index/ beside the segment's directory, else beside it)")
    wv.add_argument("--no-index", action="store_true", help="do not compare the CDXJ")
    wv.set_defaults(func=cmd_warc_verify)
    wi = w_sub.add_parser("index", help="rebuild the CDXJ of segments (sorted, written atomically)",
                          parents=[common], formatter_class=fmt)
    wi.add_argument("files", nargs="+", metavar="FILE")
    wi.add_argument("--index-dir", metavar="DIR",
                    help="write <DIR>/<segment>.cdxj (default: where verify looks for it, else beside the segment)")
    wi.add_argument("--stdout", action="store_true", help="print the sorted lines instead of writing a file")
    wi.set_defaults(func=cmd_warc_index)

    cl = sub.add_parser("cluster", help="shards on several machines (NATS JetStream)", formatter_class=fmt)
    cl_sub = cl.add_subparsers(dest="cluster_verb", metavar="ACTION", required=True)
    cs = cl_sub.add_parser("status", help="every shard of the crawl: owner node, lease age, hand-off backlog, "
                           "pages/s (read from the cluster; the same on any node)", parents=[common],
                           formatter_class=fmt)
    cs.add_argument("--json", action="store_true", help="machine-readable output")
    cs.add_argument("--cluster", metavar="URL[,URL...]", help="NATS servers (cluster.servers)")
    cs.add_argument("--timeout", type=float, default=10.0, help="seconds to reach the cluster")
    cs.set_defaults(func=cmd_cluster_status)

    c = sub.add_parser("config", help="configuration tools", formatter_class=fmt)
    c_sub = c.add_subparsers(dest="config_verb", metavar="ACTION", required=True)
    cd = c_sub.add_parser("dump", help="print the documented default config (config.toml)", parents=[common],
                          formatter_class=fmt)
    cd.set_defaults(func=cmd_config_dump)
    cc = c_sub.add_parser("check", help="validate a config file and -s overrides", parents=[common],
                          formatter_class=fmt)
    cc.set_defaults(func=cmd_config_check)
    return p


def main(argv: list[str] | None = None) -> int:
    from crawlerd.control import ControlError, NoDaemon
    from crawlerd.startup import StartupError
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except configmod.ConfigError as e:
        print(f"crawlerd: config error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except NoDaemon as e:
        print(f"crawlerd: {e}", file=sys.stderr)
        return EXIT_NO_DAEMON
    except (ControlError, StartupError, UsageError) as e:
        print(f"crawlerd: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
