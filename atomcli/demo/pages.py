"""The demo world's pages over real HTTP: `serve(corpus)` serves every article as a small HTML page on a
loopback port, so browsing can be exercised in tests and demos without the internet."""

from __future__ import annotations

import html
import re
import threading
import urllib.parse


def page_html(doc: dict) -> str:
    t = html.escape(doc.get("title", ""))
    body = "".join(f"<p>{html.escape(s)}</p>" for s in re.split(r"(?<=\.) (?=[A-Z])", doc.get("contents", "")))
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{t}</title></head>"
            f"<body><article><h1>{t}</h1>{body}</article></body></html>")


def serve(corpus_path: str, host: str = "127.0.0.1", port: int = 0):
    """Serve each article at /doc/<id> (HTML) from a daemon thread; return (server, base_url).

    `server.shutdown()` stops it. The corpus is read once into memory (the demo's is ~1 MB)."""
    import http.server

    import orjson
    docs = {}
    with open(corpus_path, "rb") as f:
        for line in f:
            if line.strip():
                d = orjson.loads(line)
                docs[str(d["id"])] = d

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            path = urllib.parse.urlparse(self.path).path
            doc_id = urllib.parse.unquote(path[5:]) if path.startswith("/doc/") else None
            if doc_id in docs:
                self._send(200, page_html(docs[doc_id]))
            elif path == "/":
                links = "".join(f'<li><a href="/doc/{urllib.parse.quote(i, safe="")}">'
                                f'{html.escape(d.get("title", i))}</a></li>' for i, d in docs.items())
                self._send(200, "<!doctype html><html><head><title>Demo world</title></head>"
                                f"<body><ul>{links}</ul></body></html>")
            else:
                self._send(404, "<!doctype html><html><body><h1>Not found</h1></body></html>")

        def _send(self, code: int, text: str):
            data = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):  # keep stderr quiet in tests
            pass

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True, name="demo-world-http").start()
    return server, f"http://{host}:{server.server_address[1]}"
