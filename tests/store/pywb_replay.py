"""Replay captures with pywb, run by pywb's own interpreter (``.venv-pywb``): not a test module.

Usage: ``python pywb_replay.py COLLECTION_ROOT < requests.json > answers.json``. COLLECTION_ROOT
holds ``collections/c/archive/*.warc.gz`` and ``collections/c/indexes/*.cdxj``. Each request
is ``[timestamp14, url]``; each answer ``{"status", "memento", "body_b64", "error"}`` from
pywb's FrontEndApp (``/c/<timestamp>id_/<url>``, the raw archived response), called as a
WSGI application in this process: no listening socket of ours, no request off this machine.
"""

import base64
import io
import json
import os
import sys


def main() -> int:
    root = sys.argv[1]
    out, sys.stdout = sys.stdout, sys.stderr        # pywb prints progress: keep stdout for the answers
    os.chdir(root)
    from pywb.apps.frontendapp import FrontEndApp  # pywb's own venv only
    app = FrontEndApp()
    answers = []
    for stamp, url in json.load(sys.stdin):
        env = {"REQUEST_METHOD": "GET", "PATH_INFO": f"/c/{stamp}id_/{url}", "QUERY_STRING": "",
               "SERVER_NAME": "localhost", "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1",
               "REMOTE_ADDR": "127.0.0.1", "HTTP_HOST": "localhost", "SCRIPT_NAME": "", "wsgi.url_scheme": "http",
               "wsgi.input": io.BytesIO(), "wsgi.errors": sys.stderr}
        got = {}

        def start_response(status, headers, exc_info=None, got=got):
            got["status"], got["headers"] = status, headers

        try:
            body = b"".join(app(env, start_response))
            headers = {k.lower(): v for k, v in got["headers"]}
            answers.append({"status": int(got["status"].split()[0]), "memento": headers.get("memento-datetime", ""),
                            "body_b64": base64.b64encode(body).decode(), "error": ""})
        except Exception as e:          # reported to the test, which fails with it
            answers.append({"status": 0, "memento": "", "body_b64": "", "error": f"{type(e).__name__}: {e}"})
    json.dump(answers, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
