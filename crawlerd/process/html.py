"""HTML pages: decode, parse (lexbor via selectolax), pull out links, robots directives, title, text.

:func:`extract` never raises on malformed input: the bytes are decoded with
replacement characters and lexbor parses any string the way a browser would
(HTML Living Standard §13.2). A page in valid UTF-8 (most of the web) goes to
lexbor as bytes, which it parses as UTF-8: the same document without a decode
to ``str`` and selectolax's encode back. The links it returns are raw hrefs; resolving
and normalising them is :func:`crawlerd.process.links.links_from_page`'s job.

Robots directives come from ``<meta name="robots">`` and ``<meta name="TOKEN">``
in the page and from the ``X-Robots-Tag`` response header
(:func:`parse_x_robots_tag`); the most restrictive wins, as search engines do.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass, field
from functools import lru_cache

from selectolax.lexbor import LexborHTMLParser

from crawlerd.url.canonical import normalize

__all__ = ["PageInfo", "extract", "decode_html", "page_codec", "charset_from_content_type",
           "parse_robots_directives", "parse_x_robots_tag", "canonical_from_link_header"]

# HTML §13.2.3.2: the encoding prescan looks at the first 1024 bytes.
_PRESCAN_BYTES = 1024
_META_CHARSET = re.compile(rb"""<meta[^>]*?charset\s*=\s*["']?\s*([A-Za-z0-9_.:\-]{1,40})""", re.I)
_HTTP_CHARSET = re.compile(r"""charset\s*=\s*["']?\s*([A-Za-z0-9_.:\-]{1,40})""", re.I)
# WHATWG Encoding Standard label mapping where Python's codec differs from what browsers use.
_LABEL_OVERRIDES = {
    "iso-8859-1": "cp1252", "iso8859-1": "cp1252", "latin1": "cp1252", "latin-1": "cp1252", "l1": "cp1252",
    "ascii": "cp1252", "us-ascii": "cp1252", "iso-8859-9": "cp1254", "latin5": "cp1254",
    "iso-8859-11": "cp874", "tis-620": "cp874", "gb2312": "gb18030", "gbk": "gb18030", "x-gbk": "gb18030",
    "shift_jis": "cp932", "shift-jis": "cp932", "sjis": "cp932", "x-sjis": "cp932", "euc-kr": "cp949",
    "big5": "big5hkscs", "x-user-defined": "cp1252",
}
# Codecs that decode bytes as something other than a text encoding of a page.
_NOT_PAGE_ENCODINGS = frozenset({"idna", "punycode", "unicode-escape", "raw-unicode-escape", "utf-7",
                                 "mbcs", "oem", "charmap"})
# Elements inside <body> whose content is not rendered as text (HTML §15: display none,
# replaced elements, fallback content).
_INVISIBLE = ["script", "style", "noscript", "template", "svg", "iframe", "object", "embed", "noembed",
              "noframes", "canvas"]
# Nesting guard. Lexbor's tree builder walks the stack of open elements for each
# block start tag ("close a p element in button scope", HTML §13.2.6.4.7), so
# parse time grows with tags x depth: 200,000 nested <div>s take minutes.
# Browsers cap the tree depth (Chromium at 512); we cut the document where the
# estimated depth first passes _MAX_DEPTH. The estimate is only computed when a
# page has more than _SCAN_ABOVE_TAGS tags: below that the worst case is small.
_MAX_DEPTH = 1024
_SCAN_ABOVE_TAGS = 4096
_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9\-]*)")
# Void elements and those closed implicitly by their next sibling cannot build depth alone.
_NO_DEPTH = frozenset({
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr",
    "p", "li", "dt", "dd", "option", "optgroup", "tr", "td", "th", "rb", "rt", "rp", "html", "head", "body",
})
_TOKEN_OK = re.compile(r"[A-Za-z0-9_\-]+")
_MAX_TITLE_CHARS = 1024


@dataclass(slots=True)
class PageInfo:
    links: list[tuple[str, bool]] = field(default_factory=list)   # (raw href, nofollow), document order
    base_url: str = ""          # URL relative links resolve against (after <base href>)
    noindex: bool = False       # page-level, from meta robots
    nofollow: bool = False      # page-level, from meta robots
    title: str = ""
    canonical: str = ""         # <link rel=canonical href> resolved and normalised (RFC 6596), or ""
    text: str = ""              # visible text, node by node, space-separated (simhash input)
    encoding: str = "utf-8"     # codec the body was decoded with
    truncated: bool = False     # nesting over the depth cap: only the part before it was parsed


@lru_cache(maxsize=256)       # labels repeat page after page; two codec lookups each otherwise
def _codec(label: str | None) -> str | None:
    if not label:
        return None
    label = label.strip().lower()
    label = _LABEL_OVERRIDES.get(label, label)
    try:
        name = codecs.lookup(label).name
    except (LookupError, ValueError):
        return None
    if name in _NOT_PAGE_ENCODINGS or not getattr(codecs.lookup(name), "_is_text_encoding", True):
        return None
    return name


def charset_from_content_type(content_type: str | None) -> str | None:
    """The ``charset`` parameter of a Content-Type value, if any."""
    if not content_type:
        return None
    m = _HTTP_CHARSET.search(content_type)
    return m.group(1) if m else None


def page_codec(body: bytes, content_type: str | None = None) -> tuple[str, int]:
    """``(codec name, offset of the text)`` :func:`decode_html` decodes a page with (the offset
    skips a byte order mark)."""
    if body[:3] == b"\xef\xbb\xbf":
        return "utf-8", 3
    if body[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return ("utf-16-le" if body[:2] == b"\xff\xfe" else "utf-16-be"), 2
    codec = _codec(charset_from_content_type(content_type))
    if codec is None:
        m = _META_CHARSET.search(body, 0, _PRESCAN_BYTES)
        if m is not None:
            codec = _codec(m.group(1).decode("ascii"))
            if codec is not None and codec.startswith("utf-16"):
                codec = "utf-8"
    return codec or "utf-8", 0


def decode_html(body: bytes, content_type: str | None = None) -> tuple[str, str]:
    """Decode a page: BOM, else the HTTP charset, else a ``<meta>`` charset, else UTF-8; never raises.

    Returns ``(text, codec name)``. Undecodable bytes become U+FFFD. Per HTML
    §13.2.3.2 a UTF-16 label found in ``<meta>`` means UTF-8 (an ASCII-compatible
    prescan could not have read it otherwise).
    """
    return _decode(body, *page_codec(body, content_type))


def _decode(body: bytes, codec: str, start: int) -> tuple[str, str]:
    """:func:`decode_html` once :func:`page_codec` has named the codec and the text's offset."""
    try:
        return body[start:].decode(codec, "replace"), codec
    except (LookupError, UnicodeError, ValueError):
        return body.decode("utf-8", "replace"), "utf-8"


def _utf8_source(body: bytes, codec: str, start: int) -> bytes | None:
    """The page's bytes when they are exactly what :func:`decode_html` would decode them to in
    UTF-8 (``codec``, from :func:`page_codec`, is UTF-8 and they are valid UTF-8), else None.
    Lexbor parses bytes as UTF-8, so such a page is parsed without a decode to ``str`` and
    selectolax's encode back."""
    if codec != "utf-8":
        return None
    src = body[start:] if start else body
    if not src.isascii():
        try:
            src.decode("utf-8")         # validates; invalid bytes need decode_html's U+FFFD
        except UnicodeDecodeError:
            return None
    return src


def parse_robots_directives(value: str) -> tuple[bool, bool]:
    """``(noindex, nofollow)`` of a comma-separated directive list (meta robots content)."""
    noindex = nofollow = False
    for token in value.lower().replace(" ", ",").split(","):
        if token == "noindex":
            noindex = True
        elif token == "nofollow":
            nofollow = True
        elif token == "none":               # none = noindex, nofollow
            noindex = nofollow = True
    return noindex, nofollow


# Directives that carry a value after ":" (so "name:" is not a user-agent prefix).
_VALUED_DIRECTIVES = frozenset({"unavailable_after", "max-snippet", "max-image-preview", "max-video-preview"})


def parse_x_robots_tag(values: list[str], agent_token: str) -> tuple[bool, bool]:
    """``(noindex, nofollow)`` for ``agent_token`` from all ``X-Robots-Tag`` header values.

    A directive applies to every crawler unless it follows a ``token:`` prefix,
    which scopes it (and what follows in the same header value) to that agent:
    ``noindex, nofollow``; ``crawlerd: noindex``; ``otherbot: noindex`` (ignored
    by us); ``otherbot: noindex, crawlerd: nofollow``. Valued directives
    (``unavailable_after: <date>``, ``max-snippet: 20``) are skipped.
    """
    me = agent_token.lower()
    noindex = nofollow = False
    for value in values:
        scope: str | None = None           # None: all agents
        skipping_value = False
        for item in value.split(","):
            item = item.strip()
            if not item:
                continue
            name, colon, rest = item.partition(":")
            name = name.strip().lower()
            if colon:
                if name in _VALUED_DIRECTIVES:
                    skipping_value = name == "unavailable_after"     # its date may contain commas
                    continue
                if not _TOKEN_OK.fullmatch(name):
                    continue                # part of a date or other value, not an agent
                scope, skipping_value = name, False
                item = rest.strip().lower()
                if not item:
                    continue
            else:
                item = name
                if skipping_value and item not in ("noindex", "nofollow", "none", "all"):
                    continue
                skipping_value = False
            if scope is not None and scope != me:
                continue
            ni, nf = parse_robots_directives(item)
            noindex |= ni
            nofollow |= nf
    return noindex, nofollow


def _depth_cut(text: str) -> int:
    """Offset where the estimated element nesting first exceeds _MAX_DEPTH, or -1.

    Estimate: +1 per start tag, -1 per end tag that matches an open one by name,
    ignoring elements in _NO_DEPTH. It over-counts unclosed formatting tags; it
    cannot be fooled by stray end tags of names that were never opened.
    """
    depth = 0
    opened: dict[str, int] = {}
    for k, (slash, name) in enumerate(_TAG.findall(text)):     # findall: no Match objects per tag
        name = name.lower()
        if name in _NO_DEPTH:
            continue
        if slash:
            n = opened.get(name, 0)
            if n:
                opened[name] = n - 1
                depth -= 1
        else:
            opened[name] = opened.get(name, 0) + 1
            depth += 1
            if depth > _MAX_DEPTH:
                for i, m in enumerate(_TAG.finditer(text)):      # rare: locate the k-th tag
                    if i == k:
                        return m.start()
    return -1


def extract(body: bytes, base_url: str, *, agent_token: str = "crawlerd", max_links: int = 5000,
            content_type: str | None = None, max_text_chars: int = 1 << 20) -> PageInfo:
    """Parse an HTML body: links (``a[href]``, ``area[href]``), ``<base href>``, meta robots, title, text.

    ``content_type`` is the response Content-Type (for its charset). Links are
    unique by raw href, in document order, at most ``max_links``; a link is
    nofollow only if every occurrence has ``rel~=nofollow``. Robots meta
    applies when named ``robots`` or ``agent_token`` (case-insensitive).
    """
    codec, start = page_codec(body, content_type)      # once: the decode below reuses it
    source: str | bytes | None = _utf8_source(body, codec, start)
    if source is not None and source.count(b"<") <= _SCAN_ABOVE_TAGS:
        info = PageInfo(base_url=base_url, encoding="utf-8")
    else:
        source, codec = _decode(body, codec, start)
        info = PageInfo(base_url=base_url, encoding=codec)
        if source.count("<") > _SCAN_ABOVE_TAGS:
            cut = _depth_cut(source)
            if cut >= 0:
                source, info.truncated = source[:cut], True
    tree = LexborHTMLParser(source)
    # Element lookups go through tags() (lexbor's by-name walk), not css(): the first css()
    # call on a document builds lexbor's CSS parser and selector engine, which costs about
    # as much as a third of the parse of a 20 KB page.
    for base in tree.tags("base"):
        attrs = base.attributes
        if "href" in attrs:
            # HTML §4.2.3: the first base element with href sets the document base URL.
            resolved = normalize(attrs["href"] or "", base_url)
            if resolved is not None:
                info.base_url = resolved
            break

    for link in tree.tags("link"):
        attrs = link.attributes
        rel = attrs.get("rel")
        if rel and "canonical" in rel.lower().split() and attrs.get("href"):
            # RFC 6596 §3: the first canonical link counts; relative to the document base
            info.canonical = normalize(attrs["href"] or "", info.base_url) or ""
            break

    me = agent_token.lower()
    for meta in tree.tags("meta"):
        attrs = meta.attributes
        if "name" not in attrs:
            continue
        name = (attrs["name"] or "").strip().lower()
        if name == "robots" or name == me:
            ni, nf = parse_robots_directives(attrs.get("content") or "")
            info.noindex |= ni
            info.nofollow |= nf

    links: dict[str, bool] = {}
    if max_links > 0:
        anchors = tree.tags("a")
        if tree.tags("area"):        # image maps are rare: let css() give a and area in document order
            anchors = tree.css("a[href], area[href]")
        for node in anchors:
            attrs = node.attributes
            href = attrs.get("href")
            if href is None:
                continue
            rel = attrs.get("rel")
            nofollow = rel is not None and "nofollow" in rel.lower().split()
            if href in links:
                if not nofollow:
                    links[href] = False
            elif len(links) < max_links:
                links[href] = nofollow
    info.links = list(links.items())

    titles = tree.tags("title")
    if titles:
        info.title = " ".join(titles[0].text().split())[:_MAX_TITLE_CHARS]

    body_node = tree.body
    if body_node is not None:
        tree.strip_tags(_INVISIBLE, recursive=True)
        # Text nodes stripped and joined by one space; whitespace inside a node is kept
        # (collapsing it would cost more than the parse; the simhash tokenizer splits anyway).
        info.text = body_node.text(separator=" ", strip=True, skip_empty=True)[:max_text_chars]
    return info


_LINK_CANONICAL = re.compile(r'<\s*([^>]*)>\s*;[^,]*?\brel\s*=\s*"?(?:[^",;]*\s)?canonical(?:\s[^",;]*)?"?', re.I)


def canonical_from_link_header(value: str | None, base_url: str) -> str:
    """The target of a ``Link: <...>; rel="canonical"`` response header (RFC 8288 §3, RFC 6596),
    resolved against the request URL and normalised; "" when there is none."""
    if not value:
        return ""
    m = _LINK_CANONICAL.search(value)
    return (normalize(m.group(1).strip(), base_url) or "") if m else ""
