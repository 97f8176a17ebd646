"""The real-web research environment: fetch + SSRF guard, faults, cache, replay, ddg, CLI.

Everything runs against a real HTTP server on 127.0.0.1 (http.server in a thread); only
ddgs's network call (`DDGS.text`) is replaced. Live internet tests are marked `network`.
"""

from __future__ import annotations

import gzip
import http.server
import json
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter
from urllib.parse import parse_qs, urlsplit

import pytest
from conftest import atom
from helpers_http import compression_bomb, send

from atomcli.agent.format import ToolCall, parse_tool_call
from atomcli.context import Context
from atomcli.env import fetch
from atomcli.env.cache import Cache, normalize_query, normalize_url
from atomcli.env.fetch import Fetcher, FetchLimits, Guard, Refused, why_forbidden
from atomcli.env.tools import NOTHING_NEW, ToolBox
from atomcli.errors import InputError
from atomcli.retry import RateLimiter, RetryPolicy, ToolFault, parse_retry_after

BIG = 50 * 1024 * 1024

ARTICLE = """<html><head><title>The Zorbl River</title></head><body>
<nav>Home | About | Contact</nav>
<article><h1>The Zorbl River</h1>
<p>The Zorbl River is a fictional river that flows through the imaginary country of Quenland.
It is 412 kilometres long and was first mapped in 1823 by the explorer Amaris Volt.</p>
<p>The river's delta hosts the city of Port Ember, famous for its glass bridges.
The population of Port Ember was 88,000 in the last census.</p>
<p>Fishing and tourism dominate the local economy. Annual festivals celebrate the flood season.</p>
</article><footer>Copyright nobody</footer></body></html>"""


class _Server:
    """Routes for every fault the environment must survive; counts hits per path."""

    def __init__(self):
        self.hits: Counter = Counter()
        self.sent: Counter = Counter()
        self.hosts: list[str] = []
        self.bomb = compression_bomb(16 + zlib.MAX_WBITS)  # gzip framing
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, code, body: bytes, ctype="text/html; charset=utf-8", headers=()):
                send(self, code, body, ctype, headers)

            def do_GET(self):  # noqa: C901 - one branch per route
                parts = urlsplit(self.path)
                path, qs = parts.path, parse_qs(parts.query)
                server.hits[path] += 1
                server.hosts.append(self.headers.get("Host", ""))
                try:
                    if path in ("/page", "/page2", "/secret"):
                        body = ARTICLE if path != "/page2" else ARTICLE.replace("Zorbl", "Quiv").replace("Port Ember", "Lowtown")
                        self._send(200, body.encode())
                    elif path == "/plain":
                        self._send(200, b"Plain words about the Zorbl River.\nSecond line.", "text/plain")
                    elif path == "/flaky429":
                        if server.hits[path] == 1:
                            self._send(429, b"slow down", headers=[("Retry-After", "5")])
                        else:
                            self._send(200, ARTICLE.encode())
                    elif path == "/always500":
                        self._send(500, b"boom")
                    elif path == "/missing":
                        self._send(404, b"no")
                    elif path == "/big":
                        self.send_response(200)
                        self.send_header("Content-Type", "text/plain")
                        self.send_header("Content-Length", str(BIG))
                        self.end_headers()
                        chunk = (b"lorem ipsum dolor sit amet " * 2500)[:65536]
                        while server.sent[path] < BIG:
                            self.wfile.write(chunk)
                            server.sent[path] += len(chunk)
                    elif path == "/bomb":
                        self._send(200, server.bomb, "text/plain", [("Content-Encoding", "gzip")])
                    elif path == "/gzipped":
                        self._send(200, gzip.compress(ARTICLE.encode()), headers=[("Content-Encoding", "gzip")])
                    elif path == "/slow":
                        time.sleep(3)
                        self._send(200, ARTICLE.encode())
                    elif path == "/trickle":
                        self.send_response(200)
                        self.send_header("Content-Type", "text/plain")
                        self.send_header("Content-Length", "100000")
                        self.end_headers()
                        for _ in range(100):
                            self.wfile.write(b"x ")
                            self.wfile.flush()
                            time.sleep(0.05)
                    elif path == "/redirect":
                        self._send(302, b"", headers=[("Location", qs["to"][0])])
                    elif path == "/loop":
                        self._send(302, b"", headers=[("Location", "/loop")])
                    elif path == "/pdf":
                        self._send(200, b"%PDF-1.4 " + b"\x00" * 1000, "application/pdf")
                    elif path == "/octet-pdf":
                        self._send(200, b"%PDF-1.4 " + b"\x00" * 1000, "application/octet-stream")
                    elif path == "/echo-host":
                        self._send(200, f"Host header was {self.headers.get('Host')}".encode(), "text/plain")
                    else:
                        self._send(404, b"not found")
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def reset(self):
        self.hits.clear()
        self.sent.clear()
        self.hosts.clear()


@pytest.fixture(scope="module")
def _server():
    s = _Server()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


@pytest.fixture
def server(_server):
    _server.reset()
    return _server


def fast_retry(attempts=3, sleeps=None) -> RetryPolicy:
    def sleep(d):
        if sleeps is not None:
            sleeps.append(d)
        time.sleep(d)
    return RetryPolicy(attempts=attempts, base=0.01, cap=0.05, max_retry_after=0.05, sleep=sleep)


def browse_call(*urls, query="") -> ToolCall:
    return parse_tool_call(json.dumps({"name": "browse_webpage", "arguments": {"url_list": list(urls), "query": query}}))


def search_call(*queries) -> ToolCall:
    return parse_tool_call(json.dumps({"name": "web_search", "arguments": {"query": list(queries)}}))


def toolbox(spec="", **kw) -> ToolBox:
    kw.setdefault("allow_hosts", "127.0.0.1")
    kw.setdefault("retry", fast_retry())
    return ToolBox(spec, Context(quiet=True), **kw)


@pytest.fixture
def fake_ddg(monkeypatch):
    """Replace only ddgs's network call; records every call's arguments."""
    import ddgs.ddgs  # the real class (ddgs.DDGS is a lazy proxy)
    calls = []

    def text(self, query, **kw):
        calls.append((query, kw))
        n = kw.get("max_results", 10)
        return [{"title": f"{query} result {i}", "href": f"https://example.org/{query.replace(' ', '-')}/{i}",
                 "body": f"Snippet   {i} about\n{query}."} for i in range(n)]

    monkeypatch.setattr(ddgs.ddgs.DDGS, "text", text)
    return calls


@pytest.fixture
def no_network(monkeypatch):
    """Every way out of the process raises (the loopback server, already listening, stays)."""
    import ddgs.ddgs  # the real class (ddgs.DDGS is a lazy proxy)

    def refuse(*a, **k):
        raise AssertionError("network used during replay")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(ddgs.ddgs.DDGS, "text", refuse)


# --- faults ------------------------------------------------------------------------------------

def test_429_then_200_is_retried_honouring_capped_retry_after(server):
    sleeps = []
    tb = toolbox(retry=fast_retry(sleeps=sleeps))
    res = tb.run(browse_call(server.url("/flaky429"), query="population"))
    assert res.ok, res.error
    assert "88,000" in res.observation
    assert server.hits["/flaky429"] == 2
    # Retry-After: 5 was honoured but capped at max_retry_after (0.05), above the 0.01 backoff
    assert sleeps == [0.05]


def test_always_500_becomes_error_observation_after_bounded_retries(server):
    tb = toolbox(retry=fast_retry(attempts=3))
    res = tb.run(browse_call(server.url("/always500")))
    assert not res.ok
    assert "HTTP 500" in res.error
    assert res.observation == f"Page {server.url('/always500')}:\nError: HTTP 500 Internal Server Error"
    assert server.hits["/always500"] == 3


def test_404_is_permanent_and_not_retried(server):
    res = toolbox().run(browse_call(server.url("/missing")))
    assert not res.ok and "HTTP 404" in res.error
    assert server.hits["/missing"] == 1


def test_50mb_page_is_cut_at_the_byte_cap(server):
    cap = 1_000_000
    t0 = time.time()
    resp = Fetcher("127.0.0.1", FetchLimits(max_bytes=cap)).get(server.url("/big"))
    assert resp.truncated and len(resp.body) == cap
    assert time.time() - t0 < 10
    time.sleep(0.2)
    assert server.sent["/big"] < 10 * cap  # the client hung up long before 50 MB
    res = toolbox(limits=FetchLimits(max_bytes=cap)).run(browse_call(server.url("/big"), query="lorem"))
    assert res.ok and "lorem ipsum" in res.observation
    assert FetchLimits().max_bytes == 5_000_000


def test_gzip_bomb_is_capped_after_decompression(server):
    cap = 2_000_000
    assert len(server.bomb) < cap  # the compressed body alone passes the raw cap
    resp = Fetcher("127.0.0.1", FetchLimits(max_bytes=cap)).get(server.url("/bomb"))
    assert resp.truncated and len(resp.body) == cap
    assert resp.body.startswith(b"bomb bomb")


def test_gzip_encoded_page_is_decoded(server):
    res = toolbox().run(browse_call(server.url("/gzipped"), query="population"))
    assert res.ok and "88,000" in res.observation


def test_slow_page_times_out(server):
    limits = FetchLimits(read_timeout=0.3, total_timeout=5)
    tb = toolbox(limits=limits, retry=fast_retry(attempts=2))
    t0 = time.time()
    res = tb.run(browse_call(server.url("/slow")))
    elapsed = time.time() - t0
    assert not res.ok and "timed out" in res.error
    assert server.hits["/slow"] == 2
    assert elapsed < 2.5


def test_trickling_page_hits_the_total_deadline(server):
    fetcher = Fetcher("127.0.0.1", FetchLimits(read_timeout=5, total_timeout=0.5))
    t0 = time.time()
    with pytest.raises(ToolFault, match="longer than 0.5 s"):
        fetcher.get(server.url("/trickle"))
    assert time.time() - t0 < 2


# --- the SSRF guard ----------------------------------------------------------------------------

@pytest.mark.parametrize("target, why", [
    ("http://127.0.0.1:{port}/secret", "loopback"),
    ("http://169.254.169.254/latest/meta-data/", "cloud metadata"),
    ("http://[::ffff:127.0.0.1]:{port}/secret", "loopback"),
    ("http://2130706433:{port}/secret", "loopback"),  # 127.0.0.1 as one integer
    ("http://metadata.google.internal/computeMetadata/v1/", "cloud metadata"),
])
def test_redirect_to_forbidden_address_is_refused(server, target, why):
    # the first hop is opened by *name* ("localhost"); the redirect's address is not
    target = target.format(port=server.port)
    res = toolbox(allow_hosts="localhost").run(
        browse_call(server.url(f"/redirect?to={target}", host="localhost")))
    assert not res.ok and why in res.error, res.error
    assert server.hits["/redirect"] == 1 and server.hits["/secret"] == 0


def test_allowed_redirect_is_followed(server):
    res = toolbox(allow_hosts="localhost").run(browse_call(
        server.url(f"/redirect?to={server.url('/page', host='localhost')}", host="localhost"), query="population"))
    assert res.ok and "88,000" in res.observation
    assert server.hits["/page"] == 1


def test_redirect_loop_is_capped(server):
    res = toolbox(limits=FetchLimits(max_redirects=3)).run(browse_call(server.url("/loop")))
    assert not res.ok and "too many redirects" in res.error
    assert server.hits["/loop"] == 4


def test_closed_allow_list_refuses_the_loopback_server(server):
    res = toolbox(allow_hosts="").run(browse_call(server.url("/page")))
    assert not res.ok and "loopback" in res.error
    assert server.hits["/page"] == 0


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://127.0.0.1/x", "gopher://127.0.0.1:70/",
                                 "data:text/html,hi", "javascript:alert(1)", "//no-scheme.example/"])
def test_non_http_schemes_are_refused(url):
    with pytest.raises(Refused, match="only http and https"):
        Guard("127.0.0.1,localhost").check(url)
    res = toolbox().run(browse_call(url))
    assert not res.ok and "only http and https" in res.observation


@pytest.mark.parametrize("addr, why", [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("10.1.2.3", "private"), ("192.168.0.1", "private"),
    ("172.16.5.4", "private"), ("169.254.1.1", "link-local"), ("fe80::1", "link-local"),
    ("224.0.0.1", "multicast"), ("0.0.0.0", "unspecified"), ("::", "unspecified"),
    ("169.254.169.254", "cloud metadata"), ("fd00:ec2::254", "cloud metadata"), ("fc00::1", "private"),
    ("::ffff:10.0.0.1", "private"), ("100.64.0.1", "not a public"), ("64:ff9b::a00:1", "private"),
])
def test_forbidden_addresses(addr, why):
    assert why in (why_forbidden(addr) or "")


@pytest.mark.parametrize("addr", ["8.8.8.8", "93.184.216.34", "2606:4700:4700::1111"])
def test_public_addresses_pass(addr):
    assert why_forbidden(addr) is None


def test_dns_answer_with_any_private_address_is_refused(monkeypatch):
    answers = {"evil.example": ["93.184.216.34", "10.0.0.7"], "fine.example": ["93.184.216.34"]}
    monkeypatch.setattr(fetch, "resolve", lambda host, port: answers[host])
    with pytest.raises(Refused, match=r"evil.example \(10.0.0.7\) is a private address"):
        Guard().check("http://evil.example/")
    assert Guard().check("https://fine.example/a?b=1").addresses == ["93.184.216.34"]


def test_connection_goes_to_the_checked_address_not_a_new_lookup(server, monkeypatch):
    # the name resolves (once, through the guard) to the allowed loopback address; any second
    # lookup (http.client re-resolving, i.e. DNS rebinding) would hit the raising getaddrinfo
    monkeypatch.setattr(fetch, "resolve", lambda host, port: ["127.0.0.1"])

    def no_lookup(*a, **k):
        raise AssertionError("name resolved a second time")

    monkeypatch.setattr(socket, "getaddrinfo", no_lookup)
    resp = Fetcher("127.0.0.1").get(f"http://rebind.example:{server.port}/echo-host")
    assert resp.body == f"Host header was rebind.example:{server.port}".encode()


def test_binary_content_is_refused_with_a_clear_observation(server):
    res = toolbox().run(browse_call(server.url("/pdf"), server.url("/octet-pdf"), server.url("/plain")))
    assert not res.ok
    pdf, octet, plain = res.observation.split("\n\n")
    assert "cannot read application/pdf content" in pdf
    assert "binary files are not supported" in octet
    assert plain.startswith(f"Page {server.url('/plain')}:\nPlain words about the Zorbl River.")


# --- retry and rate limiting --------------------------------------------------------------------

def test_retry_policy_backoff_grows_with_jitter_and_cap():
    import random
    pol = RetryPolicy(base=1.0, cap=4.0, rng=random.Random(0))
    for retry, full in [(1, 1.0), (2, 2.0), (3, 4.0), (6, 4.0)]:
        d = pol.delay(retry)
        assert full / 2 <= d <= full
    assert pol.delay(1, ToolFault("x", retry_after=3.0)) == 3.0
    assert pol.delay(1, ToolFault("x", retry_after=1e6)) == pol.max_retry_after
    calls = []
    with pytest.raises(ValueError):  # permanent errors are not retried
        RetryPolicy(sleep=lambda d: None).call(lambda: calls.append(1) or (_ for _ in ()).throw(ValueError("no")))
    assert len(calls) == 1


def test_parse_retry_after():
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("garbage") is None
    assert parse_retry_after(None) is None
    assert 99 <= parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412380.0) <= 101


def test_token_bucket_limits_the_rate():
    clock = [0.0]
    lim = RateLimiter(rate=10, burst=2, clock=lambda: clock[0], sleep=lambda d: clock.__setitem__(0, clock[0] + d))
    waits = [lim.acquire() for _ in range(6)]
    assert waits[:2] == [0.0, 0.0]  # the burst
    assert clock[0] == pytest.approx(0.4)  # then one token per 0.1 s
    lim2 = RateLimiter(rate=100, burst=1)
    t0 = time.monotonic()
    for _ in range(6):
        lim2.acquire()
    assert time.monotonic() - t0 >= 0.045


def test_toolbox_never_raises(monkeypatch):
    from atomcli import plugins

    class Broken:
        name = "broken"
        traits = plugins.SearchTraits("broken")

        def read_local(self, url):
            return None

        def search(self, query, k):
            raise KeyError("index corrupted")

    monkeypatch.setitem(plugins.SEARCH, "broken", lambda arg, ctx, **o: Broken())
    tb = toolbox("broken")
    res = tb.run(search_call("q"))
    assert not res.ok and "KeyError" in res.error and res.observation.startswith('Results for "q":\nError:')
    bad = parse_tool_call("{not json")
    res = tb.run(bad)
    assert not res.ok and res.observation.startswith("Error: invalid JSON")
    res = toolbox().run(search_call("q"))  # browse-only toolbox
    assert not res.ok and "no search backend" in res.error


# --- ddg ---------------------------------------------------------------------------------------

def test_ddg_search_maps_results_and_passes_options(fake_ddg):
    tb = toolbox("ddg", k=3, search_options={"region": "de-de", "safesearch": "off"})
    res = tb.run(search_call("zorbl river", "port ember"))
    assert res.ok, res.error
    assert fake_ddg[0][1] == {"max_results": 3, "region": "de-de", "safesearch": "off"} or \
        fake_ddg[1][1] == {"max_results": 3, "region": "de-de", "safesearch": "off"}
    first = res.observation.split("\n\n")[0]
    assert first.splitlines()[:4] == ['Results for "zorbl river":', "1. zorbl river result 0",
                                      "   url: https://example.org/zorbl-river/0", "   Snippet 0 about zorbl river."]
    assert res.data[1]["query"] == "port ember" and len(res.data[1]["results"]) == 3
    tb2 = toolbox("ddg:fr-fr")
    tb2.run(search_call("x"))
    assert fake_ddg[-1][1]["region"] == "fr-fr" and fake_ddg[-1][1]["safesearch"] == "moderate"


def test_ddg_three_queries_run_concurrently(monkeypatch):
    import ddgs.ddgs  # the real class (ddgs.DDGS is a lazy proxy)
    barrier = threading.Barrier(3, timeout=5)

    def text(self, query, **kw):
        barrier.wait()  # only passes if all three queries are in flight at once
        return [{"title": query, "href": "https://e.org/" + query, "body": "b"}]

    monkeypatch.setattr(ddgs.ddgs.DDGS, "text", text)
    res = toolbox("ddg", search_options={"rate": 100}).run(search_call("a", "b", "c"))
    assert res.ok, res.error
    assert [d["query"] for d in res.data] == ["a", "b", "c"]


def test_ddg_faults_are_retried_and_no_results_is_not_a_fault(monkeypatch):
    import ddgs.ddgs  # the real class (ddgs.DDGS is a lazy proxy)
    from ddgs.exceptions import DDGSException, RatelimitException, TimeoutException
    script = {"rl": [RatelimitException("202 Ratelimit")], "none": [DDGSException("No results found.")],
              "down": [TimeoutException("timed out")] * 5}
    count = Counter()

    def text(self, query, **kw):
        count[query] += 1
        if script[query]:
            raise script[query].pop(0)
        return [{"title": "t", "href": "https://e.org", "body": "s"}]

    monkeypatch.setattr(ddgs.ddgs.DDGS, "text", text)
    res = toolbox("ddg", retry=fast_retry(attempts=3), search_options={"rate": 100}).run(search_call("rl", "none", "down"))
    rl, none, down = res.observation.split("\n\n")
    assert rl.startswith('Results for "rl":\n1. t') and count["rl"] == 2
    assert none == 'Results for "none":\n(no results)' and count["none"] == 1
    assert down.startswith('Results for "down":\nError: ddg: TimeoutException') and count["down"] == 3
    assert not res.ok and '"down"' in res.error and '"rl"' not in res.error


# --- cache and replay --------------------------------------------------------------------------

def test_cache_hit_is_served_without_network(server, fake_ddg, tmp_path):
    cache = str(tmp_path / "c.db")
    tb = toolbox("ddg", cache=cache)
    a = tb.run(browse_call(server.url("/page"), query="population"), "q1")
    b = tb.run(browse_call(server.url("/page"), query="population"), "q2")  # new question: fresh memory
    assert a.ok and b.ok and not a.cached and b.cached
    assert a.observation == b.observation
    assert server.hits["/page"] == 1
    s1 = tb.run(search_call("Zorbl  River"))
    s2 = toolbox("ddg", cache=cache).run(search_call("zorbl river"))  # normalized key, other process-like box
    assert len(fake_ddg) == 1 and s2.cached and not s1.cached
    assert s1.observation.splitlines()[1:] == s2.observation.splitlines()[1:]
    # a larger k than recorded is a miss
    toolbox("ddg", cache=cache, k=20).run(search_call("zorbl river"))
    assert len(fake_ddg) == 2


def test_cache_ttl_and_failures_never_replace_fresh_successes(tmp_path):
    c = Cache(str(tmp_path / "c.db"), ttl=0.2)
    c.put("page", "k", "web", {"text": "good"})
    c.put("page", "k", "web", {"error": "HTTP 500"}, ok=False)
    assert c.get_fresh("page", "k", "web") == {"text": "good"}
    time.sleep(0.3)
    assert c.get_fresh("page", "k", "web") is None  # expired for live use
    assert c.get("page", "k") == {"text": "good"}   # still recorded for replay
    c.put("page", "k", "web", {"error": "HTTP 500"}, ok=False)  # a stale success may be replaced
    assert c.get("page", "k") == {"error": "HTTP 500"}


def test_normalized_keys():
    assert normalize_query("  Zorbl\tRIVER ") == normalize_query("zorbl river")
    assert normalize_url("HTTP://Example.COM:80/a?b=1#frag") == "http://example.com/a?b=1"
    assert normalize_url("https://example.com") == "https://example.com/"
    assert normalize_url("http://example.com:8080/x") != normalize_url("http://example.com/x")


def _recorded_session(tb: ToolBox, server) -> list[tuple]:
    steps = [
        (search_call("zorbl river", "port ember population"), "t1"),
        (browse_call(server.url("/page"), server.url("/missing"), query="who mapped the river"), "t1"),
        (browse_call(server.url("/page"), query="who mapped the river"), "t1"),  # nothing new
        (browse_call(server.url("/page2"), query="population"), "t2"),
        (browse_call(server.url("/always500"), "file:///etc/passwd"), "t2"),
        (search_call("zorbl river"), "t3"),
    ]
    return [(r.observation, r.ok, r.error) for r in tb.run_many(steps)[:1]] + \
        [(r.observation, r.ok, r.error) for r in (tb.run(c, k) for c, k in steps[1:])]


def test_replay_is_byte_identical_with_network_disabled(server, fake_ddg, tmp_path, monkeypatch):
    cache = str(tmp_path / "rec.db")
    recorded = _recorded_session(toolbox("ddg", cache=cache), server)
    assert recorded[2][0].endswith(NOTHING_NEW)
    assert not recorded[4][1]  # failures are part of the recording
    live_hits = sum(server.hits.values())

    import ddgs.ddgs  # the real class (ddgs.DDGS is a lazy proxy)

    def refuse(*a, **k):
        raise AssertionError("network used during replay")
    for obj, name in [(socket.socket, "connect"), (socket, "create_connection"), (socket, "getaddrinfo"),
                      (ddgs.ddgs.DDGS, "text")]:
        monkeypatch.setattr(obj, name, refuse)

    for tb in (toolbox(f"replay:{cache}"), toolbox("ddg", cache=cache, replay=True)):
        assert _recorded_session(tb, server) == recorded
    assert sum(server.hits.values()) == live_hits

    miss = toolbox(f"replay:{cache}").run(search_call("never asked"))
    assert not miss.ok and miss.error.startswith('"never asked": not recorded')
    miss = toolbox(f"replay:{cache}").run(browse_call("https://example.org/never"))
    assert not miss.ok and "not recorded" in miss.error


def test_replay_needs_an_existing_cache(tmp_path):
    from atomcli.errors import InputError
    with pytest.raises(InputError, match="cache file not found"):
        toolbox(f"replay:{tmp_path / 'none.db'}")
    with pytest.raises(InputError, match="replay needs a recorded cache"):
        toolbox("ddg", replay=True)


_WRITER = r"""
import sys, time
from atomcli.env.cache import Cache
path, who, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = Cache(path)
other = "b" if who == "a" else "a"
seen = 0
for i in range(n):
    c.put("page", f"{who}{i}", "web", {"text": f"{who} page {i}"})
    if c.get_fresh("page", f"{other}{i // 2}", "web") is not None:
        seen += 1
print(seen)
"""


def test_cache_is_safe_for_two_processes(tmp_path):
    path = str(tmp_path / "shared.db")
    n = 300
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, path, who, str(n)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for who in ("a", "b")]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1].decode()[-2000:] for o in outs]
    c = Cache(path)
    assert c.count("page") == 2 * n
    assert c.get("page", "a299") == {"text": "a page 299"} and c.get("page", "b0") == {"text": "b page 0"}
    assert c._conn().execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_new_cache_shows_other_processes_all_its_tables_or_none(tmp_path, monkeypatch):
    # CI once saw a second process find `entries` without `meta` in a cache the first was still
    # creating, and refuse it as a foreign file. Look from another connection before every
    # statement of the schema: a half-made schema must never be visible.
    import sqlite3
    from atomcli.env import cache as cache_mod
    from atomcli.safety import CACHE_TABLES, sqlite_tables
    path = tmp_path / "new.db"
    seen: list[set] = []
    real_connect = sqlite3.connect

    def connect(database, *args, **kwargs):
        conn = real_connect(database, *args, **kwargs)
        if database == str(path):  # the cache's own connection (sqlite_tables opens a read-only URI)
            conn.set_trace_callback(lambda sql: seen.append(sqlite_tables(path) or set()))
        return conn

    monkeypatch.setattr(cache_mod.sqlite3, "connect", connect)
    Cache(str(path))
    assert len(seen) > 5
    assert all(not t or CACHE_TABLES <= t for t in seen), seen
    assert CACHE_TABLES <= sqlite_tables(path)


# --- local documents and concurrency ------------------------------------------------------------

def test_local_documents_are_read_from_the_backend(monkeypatch, no_network):
    from atomcli import plugins

    class Local:
        name = "local"
        traits = plugins.SearchTraits("local", local_documents=True)

        def search(self, query, k):
            return [{"title": "Doc", "url": "local://doc/7", "snippet": "s"}]

        def read_local(self, url):
            return "The Quiv River rises in Lowtown.\nIt is 12 km long." if url == "local://doc/7" else None

    monkeypatch.setitem(plugins.SEARCH, "fakelocal", lambda arg, ctx, **o: Local())
    res = toolbox("fakelocal").run(browse_call("local://doc/7", "local://doc/8", query="Quiv river length"))
    doc7, doc8 = res.observation.split("\n\n")
    assert doc7 == "Page local://doc/7:\nThe Quiv River rises in Lowtown.\nIt is 12 km long."
    assert "only http and https" in doc8


def test_run_many_keeps_order(server, fake_ddg):
    tb = toolbox("ddg")
    calls = [(browse_call(server.url("/page"), query="population"), "a"), (search_call("x"), "b"),
             (browse_call(server.url("/missing")), "c"), (search_call("y"), "d")]
    results = tb.run_many(calls)
    assert [r.ok for r in results] == [True, True, False, True]
    assert results[1].observation.startswith('Results for "x"') and results[3].observation.startswith('Results for "y"')


# --- CLI ---------------------------------------------------------------------------------------

def test_cli_browse_prints_the_agents_observation(server):
    url = server.url("/page")
    proc = atom("browse", url, "--query", "who mapped the river", "--allow-hosts", "127.0.0.1", timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    expected = toolbox().run(browse_call(url, query="who mapped the river"), "cli").observation
    assert proc.stdout.decode() == expected + "\n"


@pytest.mark.parametrize("url, why", [("file:///etc/passwd", "only http and https"),
                                      ("{loop}", "loopback"), ("http://169.254.169.254/", "cloud metadata")])
def test_cli_browse_refusal_prints_observation_and_exits_1(server, url, why):
    url = url.format(loop=server.url("/secret"))
    proc = atom("browse", url, "--format", "json", timeout=120)
    assert proc.returncode == 1
    out = json.loads(proc.stdout)  # one object per url
    assert out["url"] == url and out["status"] == "error" and why in out["error"] and out["kept"] is None
    assert server.hits["/secret"] == 0


def test_cli_search_replay(server, fake_ddg, tmp_path):
    cache = str(tmp_path / "c.db")
    live = toolbox("ddg", cache=cache, k=5).run(search_call("zorbl river"))
    proc = atom("search", "zorbl river", "--search", f"replay:{cache}", "-k", "5", timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode() == live.observation + "\n"
    proc = atom("search", "zorbl river", "--search", "ddg", "--cache", cache, "--replay", "-k", "3",
                "--format", "json", timeout=120)
    out = [json.loads(line) for line in proc.stdout.decode().splitlines()]  # JSON Lines, one per result
    assert proc.returncode == 0 and [r["rank"] for r in out] == [1, 2, 3] and all(r["cached"] for r in out)
    proc = atom("search", "never recorded", "--search", f"replay:{cache}", timeout=120)
    assert proc.returncode == 1 and "not recorded" in proc.stdout.decode()
    proc = atom("search", "q", timeout=120)
    assert proc.returncode == 2 and b"no search backend" in proc.stderr


def test_cli_browse_replay_matches_recording(server, tmp_path):
    cache = str(tmp_path / "c.db")
    url = server.url("/page")
    rec = atom("browse", url, "--query", "population", "--allow-hosts", "127.0.0.1", "--cache", cache, timeout=120)
    assert rec.returncode == 0
    rep = atom("browse", url, "--query", "population", "--cache", cache, "--replay", timeout=120)
    assert rep.returncode == 0 and rep.stdout == rec.stdout
    assert server.hits["/page"] == 1


# --- live internet -----------------------------------------------------------------------------

@pytest.mark.network
def test_live_ddg_search_and_browse(tmp_path):
    tb = ToolBox("ddg", Context(quiet=True), k=3, cache=str(tmp_path / "live.db"))
    res = tb.run(search_call("Python programming language"))
    assert res.ok, res.error
    assert len(res.data[0]["results"]) >= 1 and res.data[0]["results"][0]["url"].startswith("http")
    page = tb.run(browse_call("https://www.python.org/about/", query="what is python"))
    assert page.ok, page.error
    assert "Python" in page.observation


# --- https ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def https_server(tmp_path_factory):
    """An HTTPS server on 127.0.0.1 with a self-signed certificate for `localhost`."""
    import shutil
    import ssl
    if shutil.which("openssl") is None:
        pytest.skip("openssl command not available to make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                   check=True, capture_output=True)
    hits = Counter()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            hits[self.path] += 1
            body = ARTICLE.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1], str(cert), hits
    httpd.shutdown()


def test_https_verifies_the_url_host_while_connecting_to_the_checked_address(https_server):
    import ssl
    port, cert, hits = https_server
    trusting = ssl.create_default_context(cafile=cert)
    resp = Fetcher("localhost", tls=trusting).get(f"https://localhost:{port}/a")
    assert resp.status == 200 and b"Zorbl" in resp.body
    # the certificate names localhost, not 127.0.0.1: verification uses the url's host
    with pytest.raises(fetch.FetchError, match="certificate"):
        Fetcher("127.0.0.1", tls=trusting).get(f"https://127.0.0.1:{port}/b")
    # an untrusted certificate is a permanent error: no retries
    res = toolbox(allow_hosts="localhost").run(browse_call(f"https://localhost:{port}/c"))
    assert not res.ok and "certificate" in res.error and hits["/c"] == 0


@pytest.mark.parametrize("wbits", [zlib.MAX_WBITS, -zlib.MAX_WBITS])
def test_deflate_bodies_zlib_wrapped_or_raw_are_decoded(wbits):
    comp = zlib.compressobj(6, zlib.DEFLATED, wbits)
    data = comp.compress(b"deflated words " * 1000) + comp.flush()
    body = fetch._Body("deflate", cap=100_000)
    for i in range(0, len(data), 7):  # arrives in small pieces
        body.feed(data[i:i + 7])
    assert body.bytes() == b"deflated words " * 1000 and not body.truncated


def test_a_backend_must_declare_the_protocol(monkeypatch):
    from atomcli import plugins

    class Bare:  # search() alone: the ToolBox would have to guess its cache name, rate limit, pages
        name = "bare"

        def search(self, query, k):
            return []

    monkeypatch.setitem(plugins.SEARCH, "bare", lambda arg, ctx, **o: Bare())
    with pytest.raises(InputError, match="does not implement atomcli.plugins.SearchBackend"):
        toolbox("bare")


def test_search_options_reach_the_backend(monkeypatch):
    from atomcli import plugins
    seen = {}

    def factory(arg, ctx, **options):
        seen.update(options)
        return _OptionBackend()

    monkeypatch.setitem(plugins.SEARCH, "opts", factory)
    assert plugins.parse_options("region=de-de, rate=1.5,burst=3,verbose=true") == {
        "region": "de-de", "rate": 1.5, "burst": 3, "verbose": True}
    ToolBox("opts", Context(quiet=True), search_options=plugins.parse_options("region=de-de,rate=2"))
    assert seen == {"region": "de-de", "rate": 2}
    with pytest.raises(InputError, match="KEY=VALUE"):
        plugins.parse_options("region")


class _OptionBackend:
    name = "opts"

    def __init__(self):
        from atomcli import plugins
        self.traits = plugins.SearchTraits("opts", rate_limit=2.0)

    def search(self, query, k):
        return []

    def read_local(self, url):
        return None
