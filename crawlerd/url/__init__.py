"""URLs: ``canonical`` (resolve, normalise, fingerprint: one resource, one spelling, one key),
``hosts`` (host key, host, port, registered domain of a normalised URL), ``filter``
(``UrlFilter``: crawler-trap defences before a URL is queued).
"""
