"""Shared pieces of the tests' loopback HTTP servers: hostile bodies, and sending a reply."""

from __future__ import annotations

import io
import zlib


def compression_bomb(wbits: int) -> bytes:
    """~60 MB of text compressed to ~60 KB, built in 1 MB steps (never whole in memory).

    `wbits` picks the framing as in `zlib.compressobj`: `zlib.MAX_WBITS` for a zlib stream
    (Content-Encoding: deflate), `16 + zlib.MAX_WBITS` for gzip, `-zlib.MAX_WBITS` for raw deflate.
    """
    comp = zlib.compressobj(9, zlib.DEFLATED, wbits)
    chunk = b"bomb " * (1 << 18)
    out = io.BytesIO()
    for _ in range(48):
        out.write(comp.compress(chunk))
    out.write(comp.flush())
    return out.getvalue()


def send(handler, code: int, body: bytes, ctype: str = "text/html; charset=utf-8", headers=()) -> None:
    """Answer one request of an `http.server` handler with `body` and an exact Content-Length."""
    handler.send_response(code)
    handler.send_header("Content-Type", ctype)
    handler.send_header("Content-Length", str(len(body)))
    for k, v in headers:
        handler.send_header(k, v)
    handler.end_headers()
    handler.wfile.write(body)
