"""moto_server with one bug fixed, for tests that enforce IAM: run with .venv-moto's python, moto_server's arguments.

With IAM enforced (INITIAL_NO_AUTH_ACTION_COUNT), moto verifies each request's SigV4 signature by signing
the request again from the URL it received. In server mode that URL's query string has been decoded by
werkzeug ("prefix=a/b/"), while the client signed the encoded form ("prefix=a%2Fb%2F", as SigV4 requires),
so every ListObjectsV2 with a "/" in its prefix fails with SignatureDoesNotMatch (moto 5.0.22; upstream
getmoto/moto#5948). Here the query is encoded again the SigV4 way before moto signs it. Nothing else
changes: the signature is still verified with the user's secret, and authorisation is moto's own.
"""

from __future__ import annotations

import sys
from urllib.parse import quote, unquote

from moto.iam import access_control
from moto.server import main

_original = access_control.IAMRequestBase._create_aws_request


def _sigv4_query(path: str) -> str:
    base, sep, query = path.partition("?")
    if not sep:
        return path
    pairs = (p.partition("=") for p in query.split("&"))
    return base + "?" + "&".join(f"{quote(unquote(k), safe='-_.~')}{eq}{quote(unquote(v), safe='-_.~')}"
                                  for k, eq, v in pairs)


def _create_aws_request(self):  # type: ignore[no-untyped-def]
    self._path = _sigv4_query(self._path)
    return _original(self)


access_control.IAMRequestBase._create_aws_request = _create_aws_request

if __name__ == "__main__":
    main(sys.argv[1:])
