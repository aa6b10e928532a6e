"""URL variants of pages, the way real sites serve them, and the oracle that tells duplicates apart.

A share of the ordinary hosts (``Site(variant_share=...)``, ``--variants``) serves each page
``/p/k.html`` under more URLs. Kinds that do **not** change the page:

``tracking:utm|ref|fbclid``  ``?utm_source=..&utm_medium=..&utm_campaign=..`` / ``?ref=word`` /
                             ``?fbclid=<token>``: the same bytes
``sort``                     ``?sort=asc|desc|new|top``: the same bytes
``print``                    ``?view=print``: the same text, print markup, ``rel=canonical``
``mobile``                   ``/m/p/k.html``: the same text, mobile markup, ``rel=canonical``
``session:query|path``       ``?sid=<hex32>`` / ``;jsessionid=<HEX32>``: the same text, the id
                             echoed in a hidden form field, ``rel=canonical``

Kinds that **do** change it (a learner must never drop them):

``paged``                    ``?page=N``, N = 2..4 another text (``page=1`` is the page itself)
``lang``                     ``?lang=de|fr`` another text (``lang=en`` is the page itself)

Every ``/p/`` page of such a host names its canonical URL (``<link rel="canonical">``). Beside a
share of its links to pages (the home page's too) a page also links a variant of the same page,
as sites do ("featured" links with tracking, print and mobile links, session ids), and each
page links its own views. Chosen by hash, so the web stays a pure function of the seed and
hosts without variants render byte-identical to before.

:func:`content_key` is the bench's oracle: the page a request target shows, from the host's
description (GET /site) alone: two targets with one key are one page.
"""

from __future__ import annotations

import random
from typing import NamedTuple

import xxhash

__all__ = ["DUPLICATE_KINDS", "CHANGING_KINDS", "profile", "View", "parse_view", "content_key", "Variants"]

DUPLICATE_KINDS = ("tracking", "sort", "print", "mobile", "session")
CHANGING_KINDS = ("paged", "lang")
_TRACKING_STYLES = ("utm", "utm", "ref", "fbclid")
_SESSION_STYLES = ("query", "path")
VARY_SHARE = 0.15            # of a variant host's same-host page links, followed by a link to a variant
FEATURED_SHARE = 0.5        # the same for the home page's links
INBOUND_SHARE = 0.5         # of links from other hosts: to a popular page, with tracking or a session id
POPULAR = 5                 # pages /p/0.html ... /p/4.html
MAX_PAGE = 4
LANGS = ("de", "fr")
_UTM = (("newsletter", "twitter", "facebook", "home", "partner", "rss"), ("email", "social", "referral", "cpc"),
        ("spring", "launch", "promo", "winter", "digest"))
_REFS = ("home", "footer", "sidebar", "related", "nav", "top")
_SORTS = ("asc", "desc", "new", "top")


def profile(seed: int, index: int, share: float) -> tuple[str, ...]:
    """The variant kinds of host ``index`` (empty for most hosts when ``share`` is small)."""
    rng = random.Random(f"simweb-variants/{seed}/{index}")
    if share <= 0 or rng.random() >= share:
        return ()
    kinds = rng.sample(DUPLICATE_KINDS, rng.randint(1, 3))
    out = []
    for k in sorted(kinds):
        if k == "tracking":
            out.append("tracking:" + rng.choice(_TRACKING_STYLES))
        elif k == "session":
            out.append("session:" + rng.choice(_SESSION_STYLES))
        else:
            out.append(k)
    if rng.random() < 0.5:
        out.append(rng.choice(CHANGING_KINDS))
    return tuple(sorted(out))


def _int(s: str) -> int | None:
    if s.isdigit() and s.isascii() and (s == "0" or s[0] != "0") and len(s) < 10:
        return int(s)
    return None


class View(NamedTuple):
    """What a request target of a variant host shows. ``page``/``lang`` pick the content (1 / ""
    is the page itself); ``print``/``mobile``/``sid`` only change its markup."""
    k: int
    page: int
    lang: str
    print: bool
    mobile: bool
    sid: str


def parse_view(kinds: tuple[str, ...] | list[str], pages: int, path: str, query: str) -> View | None:
    """The view of ``/p/k.html`` (or ``/m/p/k.html``) on a host with these variant kinds; None when
    the target is no page of it. Parameters the host gives no meaning are ignored, as servers do."""
    mobile = False
    if path.startswith("/m/p/") and "mobile" in kinds:
        path, mobile = path[2:], True
    sid = ""
    if ";" in path:
        path, _, param = path.partition(";")
        name, _, value = param.partition("=")
        if name != "jsessionid" or "session:path" not in kinds:
            return None
        sid = value
    if not (path.startswith("/p/") and path.endswith(".html")):
        return None
    k = _int(path[3:-5])
    if k is None or k >= pages:
        return None
    page, lang, printed = 1, "", False
    for item in query.split("&") if query else ():
        name, _, value = item.partition("=")
        if name == "page" and "paged" in kinds and page == 1:
            n = _int(value)
            page = n if n is not None and 1 <= n <= MAX_PAGE else 1
        elif name == "lang" and "lang" in kinds and not lang:
            lang = value if value in LANGS else ""
        elif name == "view" and value == "print" and "print" in kinds:
            printed = True
        elif name == "sid" and "session:query" in kinds and not sid:
            sid = value
    return View(k, page, lang, printed, mobile, sid)


def content_key(host: dict, target: str) -> str | None:
    """The page ``target`` shows on a host of the site description (``Site.describe()["hosts"][name]``):
    "p/k" (with "?page=N" / "?lang=l" when those change it); None if the host has no variants
    or the target is no page."""
    kinds = host.get("variants") or ()
    if not kinds:
        return None
    path, _, query = target.partition("?")
    v = parse_view(kinds, host["pages"], path, query)
    if v is None:
        return None
    extra = [f"page={v.page}"] if v.page != 1 else []
    if v.lang:
        extra.append(f"lang={v.lang}")
    return f"p/{v.k}" + ("?" + "&".join(extra) if extra else "")


def _h(*parts) -> int:
    return xxhash.xxh32_intdigest("/".join(map(str, parts)).encode())


class Variants:
    """Links to and bodies of the variants, for one bound port. No per-request state."""

    def __init__(self, seed: int, port: int) -> None:
        self.seed = seed
        self.port = port

    def _abs(self, host, path: str) -> str:
        return f"http://{host.name}{'' if self.port == 80 else f':{self.port}'}{path}"

    # -- links ---------------------------------------------------------------------------------
    def inbound(self, host, k: int) -> str:
        """The path another site links to (it drew page k): for INBOUND_SHARE of the links one of
        the popular pages, carrying the host's tracking parameters or session id if it has them."""
        h = _h(self.seed, "in", host.index, k)
        kinds = [x for x in host.variants if x.startswith(("tracking", "session"))]
        if not kinds or (h & 0xFFFF) >= INBOUND_SHARE * 0x10000:
            return f"/p/{k}.html"
        k = (h >> 16) % min(POPULAR, host.pages)
        return self._variant(host, f"/p/{k}.html", k, h, kinds[(h >> 24) % len(kinds)])

    def vary(self, host, href: str, k: int, salt: int, featured: bool = False) -> str | None:
        """For VARY_SHARE (FEATURED_SHARE on the home page) of the links ``href`` to page k: a
        duplicate variant of it to link beside it."""
        kinds = [x for x in host.variants if x.split(":")[0] in DUPLICATE_KINDS]
        h = _h(self.seed, host.index, k, salt)
        if not kinds or (h & 0xFFFF) >= (FEATURED_SHARE if featured else VARY_SHARE) * 0x10000:
            return None
        return self._variant(host, href, k, h, kinds[(h >> 16) % len(kinds)])

    def _variant(self, host, href: str, k: int, h: int, kind: str) -> str:
        salt = h & 0xFFFF
        v = h >> 20
        base, hash_, frag = href.partition("#")
        if kind == "mobile":
            return f"/m/p/{k}.html"
        if kind == "session:path":
            return f"{base};jsessionid={_h(self.seed, 'sid', host.index, k, salt):08X}{v:06X}{h:08X}" \
                   f"{_h('j', k, salt):08X}{hash_}{frag}"
        if kind == "session:query":
            q = f"sid={_h(self.seed, 'sid', host.index, k, salt):08x}{v:06x}{h:08x}{_h('s', k, salt):08x}"
        elif kind == "tracking:utm":
            q = (f"utm_source={_UTM[0][v % 6]}&utm_medium={_UTM[1][(v >> 3) % 4]}"
                 f"&utm_campaign={_UTM[2][(v >> 5) % 5]}")
        elif kind == "tracking:ref":
            q = f"ref={_REFS[v % len(_REFS)]}"
        elif kind == "tracking:fbclid":
            q = f"fbclid=IwAR{_h(self.seed, 'fb', host.index, k, salt):08x}{v:06x}{h:08x}"
        elif kind == "sort":
            q = f"sort={_SORTS[v % 4]}"
        else:
            q = "view=print"
        return f"{base}?{q}{hash_}{frag}"

    def extra_items(self, host, k: int) -> list[str]:
        """``<li>`` links page k adds: its own views, and where parameters change the page, those."""
        kinds = host.variants
        out = []
        if "print" in kinds:
            out.append(f'<li><a href="/p/{k}.html?view=print">print</a></li>\n')
        if "mobile" in kinds:
            out.append(f'<li><a href="/m/p/{k}.html">mobile</a></li>\n')
        if "sort" in kinds:
            out.append(f'<li><a href="/p/{k}.html?sort=new">newest first</a></li>\n')
        if "paged" in kinds:
            out += [f'<li><a href="/p/{k}.html?page={n}">page {n}</a></li>\n' for n in (2, 3)]
        if "lang" in kinds:
            out += [f'<li><a href="/p/{k}.html?lang={lang}">{lang}</a></li>\n' for lang in LANGS]
        return out

    # -- bodies --------------------------------------------------------------------------------
    def canonical_url(self, host, v: View) -> str:
        q = "&".join(([f"page={v.page}"] if v.page != 1 else []) + ([f"lang={v.lang}"] if v.lang else []))
        return self._abs(host, f"/p/{v.k}.html" + (f"?{q}" if q else ""))

    def decorate(self, host, v: View, body: bytes) -> bytes:
        """Add the canonical link, and print/mobile markup or the session field (text unchanged)."""
        link = f'<link rel="canonical" href="{self.canonical_url(host, v)}">\n'.encode()
        if v.mobile:
            link += b'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        if v.print:
            link += b'<link rel="stylesheet" media="print" href="/print.css">\n'
        body = body.replace(b"</title>\n", b"</title>\n" + link, 1)
        cls = " ".join(c for c, on in (("m", v.mobile), ("print", v.print)) if on)
        if cls:
            body = body.replace(b"<body>", f'<body class="{cls}">'.encode(), 1)
        if v.sid:
            body = body.replace(b"<h1", b'<input type="hidden" name="sid" value="'
                                + v.sid.encode("ascii", "replace") + b'">\n<h1', 1)
        return body

    def other_page(self, pages, host, v: View) -> bytes:
        """The text of page k's page N or translation: a different page that links back."""
        rng = random.Random(f"simweb-page/{self.seed}/{host.index}/p/{v.k}/{v.page}/{v.lang}")
        links = [(f"/p/{v.k}.html", "back", False)]
        if v.page > 1:
            links.append((f"/p/{v.k}.html?page={v.page - 1}", "previous", False))
        if v.page < MAX_PAGE and not v.lang:
            links.append((f"/p/{v.k}.html?page={v.page + 1}", "next", False))
        title = f"page {v.k} part {v.page} {v.lang}".strip()
        return pages.document(title, pages.paragraphs(rng, rng.randint(3000, 9000)) + [pages.link_list(links)])

    def route(self, pages, host, path: str, query: str):
        """A variant host's answer for a page target: (cache key, render) for a cacheable body,
        (None, body) for one that is not (a session's), or None when the target is no page."""
        v = parse_view(host.variants, host.pages, path, query)
        if v is None:
            return None
        other = v.page != 1 or bool(v.lang)
        base_key = ("pv", v.k, v.page, v.lang) if other else ("p", v.k)

        def base() -> bytes:
            return self.other_page(pages, host, v) if other else pages.page(host, v.k)
        if v.sid:
            return None, self.decorate(host, v, base())
        key = base_key + (("m",) if v.mobile else ()) + (("print",) if v.print else ())
        return key, lambda: self.decorate(host, v, base())
