"""crawlerd: a single-server, high-throughput, polite web crawler daemon."""

__version__ = "0.1.0"


def _populate_arenas() -> None:
    # Python's object arenas resident whole from their mapping (crawlerd/allocator.py
    # populate_python_arenas), installed before the imports that fill most of them: an arena
    # mapped earlier is carved pool by pool over the whole crawl
    try:
        from crawlerd._native.arenas import populate_arenas
    except ImportError:         # not built (a source checkout): pymalloc's own arenas
        return
    populate_arenas()


_populate_arenas()
