"""crawlerd: a single-server, high-throughput, polite web crawler daemon."""

__version__ = "0.1.0"
