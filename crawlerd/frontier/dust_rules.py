"""DUST rewrite rules: their grammar, how one rewrites a URL, and which rules explain a duplicate pair.

"Different URLs with Similar Text" (Bar-Yossef, Keidar, Schonfeld, *Do Not Crawl in the DUST*,
WWW 2007) are mostly produced by a few site-wide rewrites; Dasgupta, Kumar and Sasturkar
(*De-duping URLs via Rewrite Rules*, KDD 2008) learn them as rules that map a URL onto another
URL of its duplicate cluster. The rules here are the simple, safe kinds those papers find most:

========================  ===========================================================
``?p``                    drop every query parameter named ``p`` (tracking, sort order)
``?p=<cls>``              drop ``p`` when its value is of class ``cls`` (session-id-like
                          values: ``hex``, ``token``; ``num``)
``?p=v``                  drop ``p`` only with the literal value ``v`` (``?view=print``
                          mapped onto its canonical page, ``?page=1``)
``;p`` / ``;p=<cls>``     the same for path parameters (``;jsessionid=...``)
``/a/ -> /``              remove the directory token ``a`` (``/m/``, ``/amp/``, ``/print/``)
``/a/ -> /b/``            replace the directory token ``a`` by ``b``
========================  ===========================================================

Every rule only removes or replaces parts of a normalised URL (``crawlerd.url.canonical.normalize``)
and keeps the order of the rest, so its output is normalised too. A rule never touches the
last path segment (the resource name). Whether a rule is *true* on a host is the learner's
business (``crawlerd.frontier.dust``); this module is pure functions over strings.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["Parts", "Rule", "Relation", "parse", "unparse", "value_classes", "parse_rule", "derive",
           "relation", "skeleton", "differing_name", "ALL_VALUES"]

KIND_QUERY = "?"
KIND_PATH_PARAM = ";"
KIND_SEGMENT = "/"
ALL_VALUES = "*"

_NUM = re.compile(r"[0-9]+")
_HEX = re.compile(r"[0-9A-Fa-f]{8,}")
_TOKEN = re.compile(r"[A-Za-z0-9_\-~.]{16,}")
_DIGIT = re.compile(r"[0-9]")
_ALPHA = re.compile(r"[A-Za-z]")
MAX_CANDIDATES = 8          # rules derived from one pair at most
MAX_VIEW_TOKEN = 6          # a first directory this short may be a view token (/m/, /amp/, /print/)


class Parts(NamedTuple):
    """A normalised URL taken apart. ``segs[0]`` is "" (the path starts with "/"); each
    segment keeps its path parameters; ``query`` items are (name, value) with value "" for a
    bare ``name``; ``raw`` keeps each query item as written, so unparse(parse(u)) == u."""
    origin: str                         # scheme://netloc
    segs: tuple[str, ...]
    query: tuple[tuple[str, str], ...]
    raw: tuple[str, ...]


def parse(url: str) -> Parts:
    """Split a normalised URL (no fragment) into origin, path segments and query items."""
    start = url.find("://") + 3
    slash = url.find("/", start)
    if slash < 0:
        origin, rest = url, "/"
    else:
        origin, rest = url[:slash], url[slash:]
    path, q, query = rest.partition("?")
    items: tuple[str, ...] = tuple(query.split("&")) if q and query else ()
    pairs = tuple((it.partition("=")[0], it.partition("=")[2]) for it in items)
    return Parts(origin, tuple(path.split("/")), pairs, items)


def unparse(p: Parts) -> str:
    path = "/".join(p.segs) or "/"
    return f"{p.origin}{path}?{'&'.join(p.raw)}" if p.raw else p.origin + path


def _seg_params(seg: str) -> tuple[str, list[tuple[str, str]]]:
    """``name;k=v;k2`` -> ("name", [("k", "v"), ("k2", "")])."""
    base, _, rest = seg.partition(";")
    if not rest:
        return base, []
    return base, [(x.partition("=")[0], x.partition("=")[2]) for x in rest.split(";")]


def value_classes(v: str) -> tuple[str, ...]:
    """Classes of a parameter value, most specific first: ``num``; ``hex`` (8+ hex digits with
    a letter); ``token`` (16+ URL-safe characters mixing letters and digits: session-id-like)."""
    if _NUM.fullmatch(v):
        return ("num",)
    out = []
    if _HEX.fullmatch(v) and _ALPHA.search(v):
        out.append("hex")
    if _TOKEN.fullmatch(v) and _ALPHA.search(v) and _DIGIT.search(v):
        out.append("token")
    return tuple(out)


def _value_matches(vclass: str, v: str) -> bool:
    if vclass == ALL_VALUES:
        return True
    if vclass.startswith("="):
        return v == vclass[1:]
    return vclass in value_classes(v)


@dataclass(frozen=True, slots=True)
class Rule:
    """One rewrite. Key: ``text`` (e.g. ``?utm_source``, ``?sid=<hex>``, ``?view=print``,
    ``;jsessionid``, ``/m/ -> /``). ``vclass`` is "*", a class name, or "=" + a literal value."""
    kind: str
    name: str               # parameter name, or the directory token replaced
    vclass: str = ALL_VALUES
    repl: str = ""          # segment rules: the replacement token ("" removes the segment)

    @property
    def text(self) -> str:
        if self.kind == KIND_SEGMENT:
            return f"/{self.name}/ -> /{self.repl + '/' if self.repl else ''}"
        if self.vclass == ALL_VALUES:
            return self.kind + self.name
        if self.vclass.startswith("="):
            return f"{self.kind}{self.name}{self.vclass}"
        return f"{self.kind}{self.name}=<{self.vclass}>"

    @property
    def general(self) -> bool:
        """Covers many values (or any token position): trusted only with several distinct values seen."""
        return self.kind != KIND_SEGMENT and not self.vclass.startswith("=")

    def covers(self, other: Rule) -> bool:
        """Every URL ``other`` rewrites, this rule rewrites the same way (and it is not ``other``)."""
        if self.kind != other.kind or self.name != other.name or self == other or self.kind == KIND_SEGMENT:
            return False
        if self.vclass == ALL_VALUES:
            return True
        return not self.vclass.startswith("=") and other.vclass.startswith("=") and \
            _value_matches(self.vclass, other.vclass[1:])

    def apply(self, p: Parts) -> Parts | None:
        """The rewritten URL, or None when the rule does not change it."""
        if self.kind == KIND_QUERY:
            keep = [i for i, (n, v) in enumerate(p.query) if not (n == self.name and _value_matches(self.vclass, v))]
            if len(keep) == len(p.query):
                return None
            return Parts(p.origin, p.segs, tuple(p.query[i] for i in keep), tuple(p.raw[i] for i in keep))
        if self.kind == KIND_PATH_PARAM:
            segs, changed = list(p.segs), False
            for i, seg in enumerate(segs):
                if ";" not in seg:
                    continue
                base, params = _seg_params(seg)
                kept = [(n, v) for n, v in params if not (n == self.name and _value_matches(self.vclass, v))]
                if len(kept) != len(params):
                    changed = True
                    segs[i] = base + "".join(f";{n}={v}" if v else f";{n}" for n, v in kept)
            return Parts(p.origin, tuple(segs), p.query, p.raw) if changed else None
        # a directory token: never the first ("") nor the last (the resource name) segment
        for i in range(1, len(p.segs) - 1):
            if p.segs[i] == self.name:
                if self.repl:
                    segs = p.segs[:i] + (self.repl,) + p.segs[i + 1:]
                else:
                    segs = p.segs[:i] + p.segs[i + 1:]
                return Parts(p.origin, segs, p.query, p.raw)
        return None

    def values(self, p: Parts) -> list[str]:
        """The values this rule removes from ``p`` (what "several distinct values" counts)."""
        if self.kind == KIND_QUERY:
            return [v for n, v in p.query if n == self.name and _value_matches(self.vclass, v)]
        if self.kind == KIND_PATH_PARAM:
            return [v for seg in p.segs if ";" in seg for n, v in _seg_params(seg)[1]
                    if n == self.name and _value_matches(self.vclass, v)]
        return [self.name]


_RULE_TEXT = re.compile(r"([?;])([^=<>]*)(?:=<(num|hex|token)>|(=[^<>]*))?")


_PARSED: dict[str, Rule] = {}


def parse_rule(text: str) -> Rule:
    """Inverse of ``Rule.text``; ValueError on anything else. Rules are immutable values: the first
    4,096 texts parsed are kept (a host record's rules are parsed each time it is loaded)."""
    rule = _PARSED.get(text)
    if rule is None:
        rule = _parse_rule(text)
        if len(_PARSED) < 4096:
            _PARSED[text] = rule
    return rule


def _parse_rule(text: str) -> Rule:
    if text.startswith("/"):
        m = re.fullmatch(r"/([^/]+)/ -> /(?:([^/]+)/)?", text)
        if m is None:
            raise ValueError(f"not a DUST rule: {text!r}")
        return Rule(KIND_SEGMENT, m.group(1), ALL_VALUES, m.group(2) or "")
    m = _RULE_TEXT.fullmatch(text)
    if m is None or not m.group(2):
        raise ValueError(f"not a DUST rule: {text!r}")
    vclass = m.group(3) or m.group(4) or ALL_VALUES
    return Rule(m.group(1), m.group(2), vclass)


def _param_rules(kind: str, name: str, values: list[str], relevant: frozenset[str]) -> list[Rule]:
    """Rules that drop parameter ``name`` carrying ``values``: the literal (if one value), each
    class all values share, any value. Only the literal for a name known to change content."""
    out = []
    if len(set(values)) == 1:
        out.append(Rule(kind, name, "=" + values[0]))
    if name in relevant:
        return out
    shared = set(value_classes(values[0]))
    for v in values[1:]:
        shared &= set(value_classes(v))
    out += [Rule(kind, name, c) for c in value_classes(values[0]) if c in shared]
    out.append(Rule(kind, name, ALL_VALUES))
    return out


def _param_diff(kind: str, a: list[tuple[str, str]], b: list[tuple[str, str]],
                relevant: frozenset[str]) -> list[Rule] | None:
    """Rules explaining two parameter lists as the same page: drop what one has and the other has
    not, or (siblings) the name whose value differs. None when they are not that simple."""
    ca, cb = Counter(a), Counter(b)
    only_a, only_b = ca - cb, cb - ca
    if not only_a and not only_b:
        return []
    names_a = {n for n, _ in only_a}
    names_b = {n for n, _ in only_b}
    out: list[Rule] = []
    for name in sorted(names_a | names_b):
        va = [v for (n, v), c in only_a.items() if n == name for _ in range(c)]
        vb = [v for (n, v), c in only_b.items() if n == name for _ in range(c)]
        if va and vb:           # the same name, other values: only "drop it" makes them equal
            if name in relevant:
                return None
            out += [r for r in _param_rules(kind, name, va + vb, relevant) if r.general]
        else:
            out += _param_rules(kind, name, va or vb, relevant)
    return out


def derive(x: str, y: str, relevant: frozenset[str] = frozenset(), canonical: str = "",
           parts: tuple[Parts, Parts] | None = None) -> list[Rule]:
    """Candidate rules that map one of two duplicate URLs of a host onto the other (KDD 2008 §4:
    rules are generated from pairs of a duplicate cluster, then validated on the rest).

    Only differences of one kind give rules: query parameters, path parameters, or one
    directory token (removed, or replaced: then towards ``canonical`` when it is one of the two).
    ``relevant`` names parameters and tokens already shown to change content on the host: they
    only give literal-value rules. ``parts``: ``parse(x), parse(y)`` when the caller has them."""
    px, py = parts if parts is not None else (parse(x), parse(y))
    if px.origin != py.origin or x == y:
        return []
    out: list[Rule] | None = []
    if px.segs == py.segs:
        out = _param_diff(KIND_QUERY, list(px.query), list(py.query), relevant)
    elif px.query == py.query and len(px.segs) == len(py.segs) and \
            [_seg_params(s)[0] for s in px.segs] == [_seg_params(s)[0] for s in py.segs]:
        pa = [kv for s in px.segs for kv in _seg_params(s)[1]]
        pb = [kv for s in py.segs for kv in _seg_params(s)[1]]
        out = _param_diff(KIND_PATH_PARAM, pa, pb, relevant)
    elif px.query == py.query:
        out = _segment_rule(px.segs, py.segs, y if canonical == y else x if canonical == x else "", x, y,
                            relevant)
    return (out or [])[:MAX_CANDIDATES]


def _segment_rule(sx: tuple[str, ...], sy: tuple[str, ...], canonical: str, x: str, y: str,
                  relevant: frozenset[str]) -> list[Rule]:
    if len(sx) == len(sy) + 1 or len(sy) == len(sx) + 1:
        long_, short = (sx, sy) if len(sx) > len(sy) else (sy, sx)
        for i in range(1, len(short)):
            if long_[:i] + long_[i + 1:] == short and i < len(long_) - 1:
                tok = long_[i]
                return [] if tok in relevant else [Rule(KIND_SEGMENT, tok)]
        return []
    if len(sx) != len(sy) or not canonical:
        return []
    diff = [i for i in range(len(sx)) if sx[i] != sy[i]]
    if len(diff) != 1 or diff[0] in (0, len(sx) - 1):
        return []
    i = diff[0]
    src, dst = (sx[i], sy[i]) if canonical == y else (sy[i], sx[i])
    return [] if src in relevant else [Rule(KIND_SEGMENT, src, ALL_VALUES, dst)]


class Relation(NamedTuple):
    target: bool            # one side is the other's image itself (not two variants of a third URL)
    values: tuple[str, ...]  # values the rule removed (from either side)
    image: str              # the URL both map onto


class _Side:
    """``rule`` applied to one URL's parts: the rewrite (None: unchanged), the values removed, and
    (made on first use) the URL it stands for then, the same after the rules ``also`` (one tuple
    per rule and memo: see ``relation``), and the URL itself."""
    __slots__ = ("parts", "rewritten", "values", "_url", "_joint", "_plain")

    def __init__(self, rule: Rule, p: Parts):
        self.parts = p
        self.rewritten = rule.apply(p)
        self.values = rule.values(p) if self.rewritten is not None else []
        self._url: str | None = None
        self._joint: str | None = None
        self._plain: str | None = None

    @property
    def url(self) -> str:
        if self._url is None:
            self._url = unparse(self.rewritten if self.rewritten is not None else self.parts)
        return self._url

    def joint(self, also: tuple[Rule, ...]) -> str:
        if self._joint is None:
            x = self.rewritten if self.rewritten is not None else self.parts
            for r in also:
                n = r.apply(x)
                x = n if n is not None else x
            self._joint = unparse(x)
        return self._joint

    @property
    def plain(self) -> str:
        if self._plain is None:
            self._plain = unparse(self.parts)
        return self._plain


def relation(rule: Rule, a: Parts, b: Parts, also: tuple[Rule, ...] = (),
             memo: dict[tuple[int, int], _Side] | None = None) -> Relation | None:
    """How ``rule`` relates two different URLs: None unless it maps them onto one URL (after
    the rules ``also``, applied next, when given; ``rule`` must change one of them itself).
    ``memo``: a dict kept by the caller while ``rule`` and the parts live (one observation's
    pairs), so that a URL met in several pairs is rewritten once (the result is the same); with
    it, a rule always comes with the same ``also`` (or none). Without one, each side is rewritten
    for this call only."""
    if memo is None:
        memo = {}
    sa = memo.get((id(rule), id(a)))
    if sa is None:
        sa = memo[(id(rule), id(a))] = _Side(rule, a)
    sb = memo.get((id(rule), id(b)))
    if sb is None:
        sb = memo[(id(rule), id(b))] = _Side(rule, b)
    ra, rb = sa.rewritten, sb.rewritten
    if ra is None and rb is None:
        return None
    va, vb = sa.values, sb.values
    if also and sorted(va) == sorted(vb):
        return None         # ``rule`` removed the same from both: the pair says nothing of it
    vals = va + vb
    target = ra is None or rb is None
    if also:
        ua, ub = sa.joint(also), sb.joint(also)
    else:
        ua, ub = sa.url, sb.url
    if ua != ub:
        return None
    if also:            # one side is the image itself
        target = ua in (sa.plain, sb.plain)
    return Relation(target, tuple(vals), ua)


def skeleton(url: str, relevant: frozenset[str]) -> tuple[str, tuple[str, ...], str]:
    """The URL with every query and path parameter not known to change content removed, the
    names removed, and the same with its first directory token removed too ("" when there is
    none, no other directory follows it, it is longer than MAX_VIEW_TOKEN or it is known to
    matter: a view token such as ``/m/`` stands in front of the page's own path). Two URLs with one skeleton may be one page: the
    suspects the learner defers until it knows (``crawlerd.frontier.dust``)."""
    p = parse(url)
    dropped: list[str] = []
    keep_q = []
    for i, (n, _v) in enumerate(p.query):
        if n in relevant:
            keep_q.append(i)
        else:
            dropped.append(n)
    segs = p.segs
    if any(";" in s for s in segs):
        new = []
        for s in segs:
            base, params = _seg_params(s)
            kept = [(n, v) for n, v in params if n in relevant]
            dropped += [n for n, _ in params if n not in relevant]
            new.append(base + "".join(f";{n}={v}" if v else f";{n}" for n, v in kept))
        segs = tuple(new)
    sk = Parts(p.origin, segs, tuple(p.query[i] for i in keep_q), tuple(p.raw[i] for i in keep_q))
    main = unparse(sk) if dropped else url
    alt = ""
    if len(segs) >= 4 and 0 < len(segs[1]) <= MAX_VIEW_TOKEN and segs[1] not in relevant:
        alt = unparse(Parts(p.origin, segs[:1] + segs[2:], sk.query, sk.raw))
    return main, tuple(sorted(set(dropped))), alt


def alt_path(url: str, relevant: frozenset[str]) -> str:
    """A URL without query or path parameters, minus its first directory token when that is short
    (``/m/``, ``/amp/``, ``/print/``: view tokens), not known to matter and followed by at least
    one more directory; else "". Must agree with ``skeleton``."""
    s = url.find("/", 8)                # the path's "/" (scheme://host is at least 8 characters)
    if s < 0:
        return ""
    e = url.find("/", s + 1)
    if e < 0 or e == s + 1 or e - s - 1 > MAX_VIEW_TOKEN or url.find("/", e + 1) < 0 or \
            url[s + 1:e] in relevant:
        return ""
    return url[:s] + url[e:]


_MARKS: dict[Rule, str] = {}


def rule_mark(rule: Rule) -> str:
    """A substring every URL the rule rewrites contains (``name=`` or a bare ``name`` of a
    query parameter, ``;name``, ``/token/``)."""
    m = _MARKS.get(rule)
    if m is None:
        m = f"/{rule.name}/" if rule.kind == "/" else (rule.name if rule.kind == "?" else f";{rule.name}")
        if len(_MARKS) < 4096:
            _MARKS[rule] = m
    return m


def differing_name(a: Parts, b: Parts) -> str:
    """The one parameter name (query or path parameter) or directory token by which two URLs
    of a host differ, or "" when they differ in more than that (then a content difference
    cannot be pinned on one name)."""
    if a.origin != b.origin:
        return ""
    if a.segs == b.segs:
        names = {n for n, _ in (Counter(a.query) - Counter(b.query)) + (Counter(b.query) - Counter(a.query))}
        return names.pop() if len(names) == 1 else ""
    if a.query != b.query:
        return ""
    if len(a.segs) == len(b.segs):
        if [_seg_params(s)[0] for s in a.segs] != [_seg_params(s)[0] for s in b.segs]:
            return ""
        pa = Counter(kv for s in a.segs for kv in _seg_params(s)[1])
        pb = Counter(kv for s in b.segs for kv in _seg_params(s)[1])
        names = {n for n, _ in (pa - pb) + (pb - pa)}
        return names.pop() if len(names) == 1 else ""
    long_, short = (a.segs, b.segs) if len(a.segs) > len(b.segs) else (b.segs, a.segs)
    if len(long_) != len(short) + 1:
        return ""
    for i in range(1, len(long_) - 1):
        if long_[:i] + long_[i + 1:] == short:
            return long_[i]
    return ""
