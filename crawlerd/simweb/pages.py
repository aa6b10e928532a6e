"""HTML bodies of the synthetic web, rendered deterministically from (seed, host, path, port).

Each body is a join of pre-built paragraphs (``text.ParagraphPool``) and generated link lists, so
rendering costs microseconds. Links come in the forms a crawler must resolve (RFC 3986 §5.2):
root-relative, relative, ``./`` and ``../`` (also one ``..`` too many, which §5.2.4 drops at the
root), absolute, protocol-relative, with fragments; some point across hosts, to robots-protected
``/private/`` pages, to ``rel=nofollow``-only pages, to redirects, to missing pages and to media.
"""

from __future__ import annotations

import math
import random
from itertools import accumulate

from crawlerd.simweb import site as S
from crawlerd.simweb.farm import FarmLinks
from crawlerd.simweb.text import ParagraphPool, sentence, words

_LINK_KINDS = ("root_rel", "rel", "dotdot", "abs", "frag", "cross_abs", "cross_proto", "private",
               "nofollow", "redirect", "missing", "media")
_LINK_WEIGHTS = (28, 12, 8, 10, 7, 8, 3, 4, 2, 2, 1, 3)
_LINK_CUM = tuple(accumulate(_LINK_WEIGHTS))
_MEDIA = ("/img/{}.png", "/files/{}.txt", "/files/{}.pdf", "/data/{}.json")

_SAME_HOST_PAGE_KINDS = frozenset({"root_rel", "rel", "dotdot", "abs", "frag"})

SID_MARK = b"@SID@"   # placeholder in session-trap bodies, replaced by a fresh value per response


def _with_sid(href: str) -> str:
    """Insert the session-id placeholder before any fragment."""
    base, hash_, frag = href.partition("#")
    return base + "?sid=" + SID_MARK.decode() + hash_ + frag


class PageRenderer:
    """Renders bodies for one bound port (absolute links carry it). Holds no per-request state."""

    __slots__ = ("site", "pool", "port", "seed", "variants", "farm", "scheme")

    def __init__(self, site: S.Site, pool: ParagraphPool, port: int, variants=None, scheme: str = "http") -> None:
        self.site = site
        self.pool = pool
        self.port = port
        self.seed = site.seed
        self.variants = variants      # simweb.variants.Variants: links to URL variants (hosts that have them)
        self.farm = FarmLinks(site.shape, site.hosts, site.hosts[:site.n_hosts]) if site.shape.active else None
        self.scheme = scheme            # of absolute links: the web is all http or all https

    # --- helpers ---
    def authority(self, host: S.HostSpec) -> str:
        default = 443 if self.scheme == "https" else 80
        return host.name if self.port == default else f"{host.name}:{self.port}"

    def _shape(self, rng: random.Random) -> tuple[int, int]:
        """(target body bytes, links) of one /p/ page, drawn from the site's profile."""
        if self.site.profile == S.PROFILE_WEB:
            lo, hi = S.WEB_SIZE_RANGE_BYTES
            size = int(rng.lognormvariate(math.log(S.WEB_SIZE_MEDIAN_BYTES), S.WEB_SIZE_SIGMA))
            llo, lhi = S.WEB_LINKS_RANGE
            links = int(rng.lognormvariate(math.log(S.WEB_LINKS_MEDIAN), S.WEB_LINKS_SIGMA))
            return min(hi, max(lo, size)), min(lhi, max(llo, links))
        return rng.randint(5 * 1024, 30 * 1024), rng.randint(10, 60)

    def _rng(self, host: S.HostSpec, key: str) -> random.Random:
        return random.Random(f"simweb-page/{self.seed}/{host.index}/{key}")

    def _doc(self, title: str, parts: list[bytes], meta_nofollow: bool = False) -> bytes:
        meta = b'<meta name="robots" content="nofollow">\n' if meta_nofollow else b""
        t = title.encode()
        head = (b'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n<title>'
                + t + b"</title>\n" + meta + b"</head>\n<body>\n<h1>" + t + b"</h1>\n")
        return head + b"".join(parts) + b"</body></html>\n"

    @staticmethod
    def _ul(links: list[tuple[str, str, bool]]) -> bytes:
        items = []
        for href, anchor, nofollow in links:
            rel = ' rel="nofollow"' if nofollow else ""
            items.append(f'<li><a href="{href}"{rel}>{anchor}</a></li>\n')
        return ("<ul>\n" + "".join(items) + "</ul>\n").encode()

    def _paragraphs(self, rng: random.Random, target_bytes: int) -> list[bytes]:
        paras = self.pool.paragraphs
        return [paras[i] for i in self.pool.pick(rng, target_bytes)]

    # the building blocks, for other page kinds (variants)
    def document(self, title: str, parts: list[bytes]) -> bytes:
        return self._doc(title, parts)

    def paragraphs(self, rng: random.Random, target_bytes: int) -> list[bytes]:
        return self._paragraphs(rng, target_bytes)

    def link_list(self, links: list[tuple[str, str, bool]]) -> bytes:
        return self._ul(links)

    def entry_path(self, host: S.HostSpec, rng: random.Random) -> str:
        """A path that exists on ``host``, as another host would link to it."""
        if host.role == S.ROLE_TRAP_CALENDAR:
            return f"/cal?y={2020 + int(rng.random() * 10)}&m={1 + int(rng.random() * 12)}"
        if host.role == S.ROLE_TRAP_DEPTH:
            return "/a/b/"
        if host.role == S.ROLE_TRAP_SESSION:
            return f"/p/{int(rng.random() * host.pages)}.html?sid={rng.getrandbits(64):016x}"
        k = int(rng.random() * host.pages)
        if self.variants is not None and host.variants:
            return self.variants.inbound(host, k)
        return f"/p/{k}.html"

    def _li_items(self, host: S.HostSpec, rng: random.Random, n: int) -> list[str]:
        """n ``<li>`` link items. The hot path of page rendering: common kinds are built inline."""
        anchors, bits = self.pool.anchors, ParagraphPool.ANCHOR_BITS
        rand, getbits, pages = rng.random, rng.getrandbits, host.pages
        session = host.role == S.ROLE_TRAP_SESSION
        vary = self.variants.vary if self.variants is not None and host.variants else None
        out = []
        for kind in rng.choices(_LINK_KINDS, cum_weights=_LINK_CUM, k=n):
            anchor = anchors[getbits(bits)]
            k = int(rand() * pages)
            nofollow = False
            if kind == "root_rel":
                href = f"/p/{k}.html"
            elif kind == "rel":
                href = f"{k}.html"
            elif kind == "dotdot":
                href = (f"../p/{k}.html", f"./{k}.html", f"../../p/{k}.html")[int(rand() * 3)]
            elif kind == "abs":
                href = f"{self.scheme}://{self.authority(host)}/p/{k}.html"
            elif kind == "frag":
                href = f"/p/{k}.html#s{int(rand() * 8)}"
            else:
                href, nofollow = self._rare_href(host, rng, kind)
            if session and kind in _SAME_HOST_PAGE_KINDS:
                href = _with_sid(href)
            out.append(f'<li><a href="{href}" rel="nofollow">{anchor}</a></li>\n' if nofollow
                       else f'<li><a href="{href}">{anchor}</a></li>\n')
            if vary is not None and kind in _SAME_HOST_PAGE_KINDS:
                v = vary(host, href, k, len(out))
                if v is not None:
                    out.append(f'<li><a href="{v}">{anchor}</a></li>\n')
        return out

    def _rare_href(self, host: S.HostSpec, rng: random.Random, kind: str) -> tuple[str, bool]:
        rand = rng.random
        if kind in ("cross_abs", "cross_proto"):
            other = self.site.hosts[int(rand() * self.site.n_hosts)]
            scheme = f"{self.scheme}:" if kind == "cross_abs" else ""
            return f"{scheme}//{self.authority(other)}{self.entry_path(other, rng)}", False
        if kind == "private":
            sub = "open/" if rand() < 0.5 else ""
            return f"/private/{sub}{int(rand() * S.LEAF_PAGES)}.html", False
        if kind == "nofollow":
            return f"/nf/{int(rand() * S.LEAF_PAGES)}.html", True
        if kind == "redirect":
            return f"/r/{int(rand() * host.pages)}", False
        if kind == "missing":
            return f"/p/{host.pages + int(rand() * 5)}.html", False
        return _MEDIA[int(rand() * len(_MEDIA))].format(int(rand() * S.MEDIA_FILES)), False

    # --- bodies ---
    def page(self, host: S.HostSpec, k: int) -> bytes:
        """/p/{k}.html. Exact duplicates return the source's bytes. Near duplicates differ only in
        markup (a comment and a class attribute): different bytes and digest, the same visible text,
        so any text simhash puts them at distance 0 whatever its shingling (a one-word text change
        already moves a 64-bit simhash of a 5 KB page by up to 8 bits)."""
        src = host.exact_dups.get(k)
        if src is not None:
            return self.page(host, src)
        src = host.near_dups.get(k)
        if src is not None:
            marked = f'<!-- revision {k} -->\n<h1 class="rev-{k}">'.encode()
            return self.page(host, src).replace(b"<h1>", marked, 1)
        rng = self._rng(host, f"p/{k}")
        title = sentence(rng, rng.randint(3, 7))[:-1]
        target, n_links = self._shape(rng)
        if k in host.meta_nofollow:
            # only reachable from here: a crawler that ignores <meta name=robots> fetches /mnf/
            items = [f'<li><a href="/mnf/{int(rng.random() * S.LEAF_PAGES)}.html">'
                     f'{" ".join(words(rng, 2))}</a></li>\n' for _ in range(n_links)]
        else:
            items = self._li_items(host, rng, n_links)
            if self.variants is not None and host.variants:
                items += self.variants.extra_items(host, k)
            if self.farm is not None:        # links into the giants and the farm (farm.py)
                items += [f'<li><a href="{h}">{" ".join(words(rng, 2))}</a></li>\n'
                          for h in self.farm.extra_hrefs(host, rng, self.authority)]
        paras = self._paragraphs(rng, max(256, target - 60 * n_links))
        parts: list[bytes] = []
        per = max(1, len(items) // max(1, len(paras)))
        li = 0
        for p in paras:
            parts.append(p)
            if li < len(items):
                parts.append(("<ul>\n" + "".join(items[li:li + per]) + "</ul>\n").encode())
                li += per
        if li < len(items):
            parts.append(("<ul>\n" + "".join(items[li:]) + "</ul>\n").encode())
        if rng.random() < 0.3:
            img = int(rng.random() * S.MEDIA_FILES)
            parts.append(f'<p><img src="/img/{img}.png" alt="figure"></p>\n'.encode())
        return self._doc(title, parts, k in host.meta_nofollow)

    def text_page(self, title: str, text_bytes: int, rng: random.Random, links: list[tuple[str, str, bool]]) -> bytes:
        """A page of about ``text_bytes`` of text and one list of ``(href, anchor, nofollow)`` links."""
        return self._doc(title, self._paragraphs(rng, text_bytes) + [self._ul(links)])

    def leaf(self, host: S.HostSpec, prefix: str, k: int) -> bytes:
        """/private/k.html, /private/open/k.html, /nf/k.html, /mnf/k.html: small pages linking back."""
        rng = self._rng(host, f"{prefix}{k}")
        title = sentence(rng, 4)[:-1]
        links = [(f"/p/{int(rng.random() * host.pages)}.html", " ".join(words(rng, 2)), False)
                 for _ in range(5)]
        return self._doc(title, self._paragraphs(rng, 3000) + [self._ul(links)])

    def root(self, host: S.HostSpec) -> bytes:
        rng = self._rng(host, "root")
        title = f"{host.name} home"
        if host.role == S.ROLE_TRAP_CALENDAR:
            links = [("/cal?y=2026&m=11", "calendar", False)]
        elif host.role == S.ROLE_TRAP_DEPTH:
            links = [("a/", "a", False), ("b/", "b", False)]
        else:
            links = [(f"/p/{k}.html", " ".join(words(rng, 2)), False) for k in range(min(host.pages, 30))]
            for _ in range(3):
                other = self.site.hosts[int(rng.random() * self.site.n_hosts)]
                href = f"{self.scheme}://{self.authority(other)}{self.entry_path(other, rng)}"
                links.append((href, other.name, False))
            links += [("/private/0.html", "private", False), ("/private/open/0.html", "open", False),
                      ("/nf/0.html", "nofollow", True), ("/files/0.txt", "notes", False)]
            if host.role == S.ROLE_TRAP_SESSION:
                links = [(_with_sid(href), a, nf) if href.startswith("/p/") else (href, a, nf)
                         for href, a, nf in links]
            elif self.variants is not None and host.variants:
                n = min(host.pages, 30)          # the first n links are /p/0.html ... /p/{n-1}.html
                with_variants = []
                for i, (href, a, nf) in enumerate(links):
                    with_variants.append((href, a, nf))
                    v = self.variants.vary(host, href, i, -1, featured=True) if i < n else None
                    if v is not None:
                        with_variants.append((v, a, nf))
                links = with_variants
        return self._doc(title, self._paragraphs(rng, 2000) + [self._ul(links)])

    def calendar(self, host: S.HostSpec, y: int, m: int) -> bytes:
        rng = self._rng(host, f"cal/{y}/{m}")
        py, pm = (y, m - 1) if m > 1 else (y - 1, 12)
        ny, nm = (y, m + 1) if m < 12 else (y + 1, 1)
        links = [(f"/cal?y={py}&m={pm}", "previous month", False),
                 (f"/cal?y={ny}&m={nm}", "next month", False),
                 (f"/cal?y={y + 1}&m={m}", "next year", False),
                 (f"/cal?y={y - 1}&m={m}", "previous year", False)]
        return self._doc(f"Calendar {y:04d}-{m:02d}", self._paragraphs(rng, 1500) + [self._ul(links)])

    def depth(self, host: S.HostSpec, path: str) -> bytes:
        rng = self._rng(host, "depth/" + path[-64:])
        links = [("a/", "deeper a", False), ("b/", "deeper b", False), ("/", "home", False)]
        return self._doc(f"Depth {path.count('/') - 1}", self._paragraphs(rng, 1500) + [self._ul(links)])
