"""Fetching web pages for `browse_webpage`: the HTTP client, the SSRF guard, and HTML -> text.

Browse URLs come from model output, so every request is treated as hostile input:

- only http and https; the host is resolved once, every resolved address is checked
  (loopback, private, link-local, multicast, reserved, unspecified, cloud metadata and any
  other non-public address are refused), and the connection goes to the address that was
  checked, so a DNS answer that changes between check and connect (rebinding) cannot
  redirect it;
- redirects are followed here, hop by hop, each hop checked again, at most `max_redirects`;
- connect/read timeouts plus a deadline for the whole fetch (a server that trickles one byte
  a second defeats a per-read timeout alone). The deadline holds at every stage, connecting,
  the TLS handshake, the status line and headers included: a watchdog shuts the socket down
  when it passes, whatever the server sends (`_Watchdog`). A caller's own deadline
  (`get(url, deadline=...)`, the ToolBox's per-url one, retries included) can only shorten it;
- a byte cap on what is read and, separately, on what gzip/deflate decompress to (a 100 KB
  gzip bomb can expand to gigabytes);
- binary content (PDF, images, archives, ...) is refused before its body is read.

`allow_hosts` (host names or IP literals) opens addresses explicitly, for the demo web
server and tests on 127.0.0.1. Environment proxies are not used: the guard must see the
address actually connected to.

Failures are classified for `atomcli.retry`: `ToolFault` (timeouts, connection errors, HTTP
429 and 5xx) is retried; `Refused` and `FetchError` are permanent.
"""

from __future__ import annotations

import codecs
import http.client
import ipaddress
import re
import socket
import ssl
import threading
import time
import zlib
from dataclasses import dataclass
from urllib.parse import quote, urljoin, urlsplit

from atomcli.retry import ToolFault, parse_retry_after

DEFAULT_MAX_BYTES = 5_000_000
REDIRECT_CODES = (301, 302, 303, 307, 308)

# Addresses and names of cloud instance-metadata services. The IPv4 one is link-local and the
# IPv6 one is unique-local anyway; they are named so that the refusal says what they are.
METADATA_IPS = {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254"),
                ipaddress.ip_address("100.100.100.200")}  # AWS/GCP/Azure, AWS IPv6, Alibaba
METADATA_HOSTS = {"metadata.google.internal", "metadata.goog", "metadata", "instance-data",
                  "instance-data.ec2.internal"}
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

# Declared types refused before the body is read. Anything text-like is read; an unknown or
# generic type (application/octet-stream, none) is read under the cap and sniffed.
BINARY_PREFIXES = ("image/", "audio/", "video/", "font/", "model/")
BINARY_TYPES = {
    "application/pdf", "application/zip", "application/gzip", "application/x-gzip", "application/x-tar",
    "application/x-7z-compressed", "application/x-rar-compressed", "application/vnd.rar", "application/msword",
    "application/postscript", "application/x-shockwave-flash", "application/wasm", "application/java-archive",
    "application/x-msdownload", "application/x-executable", "application/vnd.ms-excel",
    "application/vnd.ms-powerpoint",
}
HTML_TYPES = {"text/html", "application/xhtml+xml", "text/xml", "application/xml", "application/rss+xml",
              "application/atom+xml"}
TEXT_TYPES = {"application/json", "application/ld+json", "application/javascript", "application/x-yaml",
              "application/yaml"}


class Refused(Exception):
    """The URL guard refused a URL (scheme, address, or malformed). Permanent."""


class FetchError(Exception):
    """A permanent fetch failure: HTTP 4xx, unsupported content, TLS verification, redirect loop."""


@dataclass
class FetchLimits:
    connect_timeout: float = 10.0
    read_timeout: float = 20.0     # per socket read
    total_timeout: float = 30.0    # the whole fetch, redirects included
    max_bytes: int = DEFAULT_MAX_BYTES  # cap on bytes read, and separately on bytes decompressed
    max_redirects: int = 5
    user_agent: str = "Mozilla/5.0 (compatible; atomcli research agent)"


@dataclass
class Response:
    url: str            # the final url, after redirects
    status: int
    content_type: str   # lower-case mime type without parameters ("" when absent)
    charset: str | None
    body: bytes         # decoded from gzip/deflate, at most max_bytes
    truncated: bool     # the body was cut at the cap


@dataclass
class Target:
    """A URL that passed the guard, and the addresses that may be connected to."""
    scheme: str
    host: str
    port: int
    path: str
    addresses: list[str]


# --- the guard --------------------------------------------------------------------------------

def resolve(host: str, port: int) -> list[str]:
    """All addresses `host` resolves to (module-level so tests can substitute a resolver)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise ToolFault(f"cannot resolve {host}: {e}") from e
    out = []
    for info in infos:
        addr = info[4][0]
        if addr not in out:
            out.append(addr)
    return out


def why_forbidden(addr: str | ipaddress._BaseAddress) -> str | None:
    """Why an address must not be connected to, or None if it is a public address."""
    ip = ipaddress.ip_address(addr.split("%", 1)[0]) if isinstance(addr, str) else addr
    if ip.version == 6:
        # IPv6 forms that carry an IPv4 address reach that address: judge the IPv4 one
        embedded = ip.ipv4_mapped or ip.sixtofour or (
            ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) if ip in _NAT64 else None)
        if embedded is not None:
            return why_forbidden(embedded)
    if ip in METADATA_IPS:
        return "a cloud metadata address"
    for test, what in (("is_loopback", "a loopback address"), ("is_unspecified", "an unspecified address"),
                       ("is_link_local", "a link-local address"), ("is_multicast", "a multicast address"),
                       ("is_private", "a private address"), ("is_reserved", "a reserved address")):
        if getattr(ip, test):
            return what
    if not ip.is_global:
        return "not a public address"
    return None


def _ip_or_none(text: str):
    try:
        return ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
    except ValueError:
        return None


class Guard:
    """Decides which URLs may be fetched. `allow_hosts`: "127.0.0.1,localhost" (names or IPs)."""

    def __init__(self, allow_hosts: str | list[str] | tuple = ""):
        items = allow_hosts.split(",") if isinstance(allow_hosts, str) else list(allow_hosts)
        items = [h.strip().lower().strip("[]").rstrip(".") for h in items if h and h.strip()]
        self.allow_ips = {ip for ip in map(_ip_or_none, items) if ip is not None}
        self.allow_names = {h for h in items if _ip_or_none(h) is None}

    def check(self, url: str) -> Target:
        """Parse, resolve and check `url`; raise Refused (or ToolFault when DNS fails)."""
        try:
            parts = urlsplit(url.strip())
            port = parts.port
        except ValueError as e:
            raise Refused(f"malformed url ({e})") from e
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise Refused(f"only http and https urls can be browsed, not `{scheme or '(none)'}:`")
        host = (parts.hostname or "").rstrip(".")
        if not host:
            raise Refused("url has no host")
        try:
            host = host.encode("idna").decode("ascii") if not host.isascii() else host
        except UnicodeError as e:
            raise Refused(f"invalid host name ({e})") from e
        port = port or (443 if scheme == "https" else 80)
        path = parts.path or "/"
        path = quote(path, safe="/%:@!$&'()*+,;=-._~")
        if parts.query:
            path += "?" + quote(parts.query, safe="/%:@!$&'()*+,;=-._~?")
        target = Target(scheme, host, port, path, [])
        if host in self.allow_names:
            target.addresses = resolve(host, port)
            return target
        if host in METADATA_HOSTS:
            raise Refused(f"{host} is a cloud metadata service")
        literal = _ip_or_none(host)
        addresses = [str(literal)] if literal is not None else resolve(host, port)
        if not addresses:
            raise ToolFault(f"cannot resolve {host}")
        for addr in addresses:
            ip = _ip_or_none(addr)
            if ip is None:
                raise Refused(f"{host} resolved to an unparseable address {addr!r}")
            if ip in self.allow_ips:
                continue
            why = why_forbidden(ip)
            if why:
                # refuse the host even if it also has public addresses: a client that picks
                # one of them at random is how DNS-based SSRF bypasses work
                shown = host if literal is not None else f"{host} ({addr})"
                raise Refused(f"{shown} is {why}")
        target.addresses = addresses
        return target


# --- the client ---------------------------------------------------------------------------------

class _Watchdog:
    """Shuts the watched socket down at the deadline, so that no read or handshake outlives it.

    Timeouts bound each socket operation, not their sum: a server that sends one byte of its
    status line or headers every few seconds never trips a per-read timeout. At the deadline
    the socket is shut down (the raw socket, also under TLS) and any blocked read returns."""

    def __init__(self, deadline: float):
        self.fired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            if self.fired:
                self._shut(sock)

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            if self._sock is not None:
                self._shut(self._sock)

    @staticmethod
    def _shut(sock: socket.socket) -> None:
        try:
            socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the fd itself, not SSLSocket's unwrap
        except OSError:
            pass

    def cancel(self) -> None:
        self._timer.cancel()


def _left(deadline: float | None, cap: float) -> float:
    """A socket timeout: `cap`, or less when the deadline is nearer (never 0, which means non-blocking)."""
    if deadline is None:
        return cap
    return max(0.001, min(cap, deadline - time.monotonic()))


def _connect(target: Target, limits: FetchLimits, tls: ssl.SSLContext | None,
             watchdog: _Watchdog | None = None, deadline: float | None = None) -> socket.socket:
    """A socket to one of the checked addresses (never re-resolving the name)."""
    last: Exception | None = None
    for addr in target.addresses:
        # a raw socket to the literal address: no name lookup can happen after the check
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        if watchdog is not None:
            watchdog.watch(sock)
        sock.settimeout(_left(deadline, limits.connect_timeout))
        try:
            sock.connect((addr, target.port))
        except OSError as e:
            sock.close()
            last = e
            continue
        if target.scheme == "https":
            try:
                sock = tls.wrap_socket(sock, server_hostname=target.host)
            except ssl.SSLCertVerificationError as e:
                sock.close()
                raise FetchError(f"TLS certificate of {target.host} not valid: {e.verify_message}") from e
            except (ssl.SSLError, OSError) as e:
                sock.close()
                last = e
                continue
        return sock
    if isinstance(last, (TimeoutError, socket.timeout)):
        raise ToolFault(f"connecting to {target.host} timed out")
    raise ToolFault(f"cannot connect to {target.host}:{target.port} ({last})")


class _PinnedConnection(http.client.HTTPConnection):
    """http.client with the socket made by `_connect`; Host header and TLS name stay the url's host."""

    def __init__(self, target: Target, limits: FetchLimits, tls: ssl.SSLContext | None,
                 watchdog: _Watchdog | None = None, deadline: float | None = None):
        super().__init__(target.host, target.port, timeout=limits.connect_timeout)
        self._target, self._limits, self._tls = target, limits, tls
        self._watchdog, self._deadline = watchdog, deadline

    def connect(self):
        self.sock = _connect(self._target, self._limits, self._tls, self._watchdog, self._deadline)
        if self._watchdog is not None:
            self._watchdog.watch(self.sock)
        self.sock.settimeout(_left(self._deadline, self._limits.read_timeout))
        # http.client drops self.sock once a `Connection: close` response owns it; the body
        # reader still needs the socket to tighten its timeout toward the deadline
        self.pinned_sock = self.sock


def _media_type(header: str | None) -> tuple[str, str | None]:
    if not header:
        return "", None
    mime, _, params = header.partition(";")
    m = re.search(r"charset\s*=\s*\"?([\w.:-]+)", params, re.I)
    return mime.strip().lower(), (m.group(1) if m else None)


def is_binary_type(mime: str) -> bool:
    return mime in BINARY_TYPES or mime.startswith(BINARY_PREFIXES) or mime.startswith("application/vnd.openxml")


class _Body:
    """Reads a response body under the byte cap and deadline, decompressing gzip/deflate."""

    def __init__(self, encoding: str, cap: int):
        encoding = (encoding or "").strip().lower()
        if encoding in ("gzip", "x-gzip"):
            self.dec = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self.dec = zlib.decompressobj(zlib.MAX_WBITS)  # zlib-wrapped; raw deflate handled below
        elif encoding in ("", "identity"):
            self.dec = None
        else:
            raise FetchError(f"unsupported content encoding `{encoding}`")
        self.encoding, self.cap = encoding, cap
        self.chunks: list[bytes] = []
        self.size = 0
        self.truncated = False

    def _keep(self, data: bytes) -> None:
        room = self.cap - self.size
        if len(data) > room:
            data, self.truncated = data[:room], True
        self.chunks.append(data)
        self.size += len(data)

    def feed(self, raw: bytes) -> None:
        if self.dec is None:
            self._keep(raw)
            return
        try:
            # max_length bounds each output: a bomb never expands past the cap in memory
            out = self.dec.decompress(raw, self.cap - self.size + 1)
            self._keep(out)
            while self.dec.unconsumed_tail and not self.truncated:
                self._keep(self.dec.decompress(self.dec.unconsumed_tail, self.cap - self.size + 1))
            if self.dec.unconsumed_tail:
                self.truncated = True
        except zlib.error as e:
            if self.encoding == "deflate" and self.size == 0 and not self.chunks:
                # some servers send raw deflate despite the spec: retry this stream raw
                self.dec = zlib.decompressobj(-zlib.MAX_WBITS)
                self.encoding = "raw-deflate"
                self.feed(raw)
                return
            raise FetchError(f"corrupt {self.encoding} body ({e})") from e

    def full(self) -> bool:
        # exactly `cap` bytes is not yet "cut": only data beyond the cap sets truncated
        return self.truncated

    def bytes(self) -> bytes:
        return b"".join(self.chunks)


class Fetcher:
    """One GET with the guard on every hop. Thread-safe (no shared mutable state)."""

    def __init__(self, allow_hosts: str = "", limits: FetchLimits | None = None, tls: ssl.SSLContext | None = None):
        self.guard = Guard(allow_hosts)
        self.limits = limits or FetchLimits()
        self._tls = tls or ssl.create_default_context()  # `tls`: e.g. a context trusting a private CA

    def get(self, url: str, deadline: float | None = None) -> Response:
        """GET `url` within `total_timeout`, or by `deadline` (time.monotonic()) when that is sooner."""
        lim = self.limits
        own = time.monotonic() + lim.total_timeout
        deadline = own if deadline is None else min(deadline, own)
        late = ToolFault(f"page took longer than {lim.total_timeout:g} s to download")
        for _hop in range(lim.max_redirects + 1):
            if time.monotonic() >= deadline:
                raise late
            target = self.guard.check(url)
            watchdog = _Watchdog(deadline)
            conn = _PinnedConnection(target, lim, self._tls if target.scheme == "https" else None,
                                     watchdog, deadline)
            try:
                status, location, resp = self._request(conn, target, url, deadline)
            except (ToolFault, FetchError) as e:
                if watchdog.fired:  # whatever the read saw, the deadline cut it
                    raise late from e
                raise
            finally:
                watchdog.cancel()
                conn.close()
            if watchdog.fired:  # the body may have been cut by the shutdown: never a whole page
                raise late
            if location is None:
                return resp
            url = urljoin(url, location)
        raise FetchError(f"too many redirects (more than {lim.max_redirects})")

    def _request(self, conn, target: Target, url: str, deadline: float):
        lim = self.limits
        try:
            conn.timeout = _left(deadline, lim.connect_timeout)
            conn.request("GET", target.path, headers={
                "User-Agent": lim.user_agent, "Accept": "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.5",
                "Accept-Encoding": "gzip, deflate", "Connection": "close"})
            resp = conn.getresponse()
            status = resp.status
            if status in REDIRECT_CODES:
                location = resp.getheader("Location")
                if not location:
                    raise FetchError(f"HTTP {status} redirect without a Location header")
                return status, location.strip(), None
            if status == 429 or status >= 500:
                raise ToolFault(f"HTTP {status} {resp.reason}".strip(), status=status,
                                retry_after=parse_retry_after(resp.getheader("Retry-After")))
            if status >= 400:
                raise FetchError(f"HTTP {status} {resp.reason}".strip())
            mime, charset = _media_type(resp.getheader("Content-Type"))
            if is_binary_type(mime):
                raise FetchError(f"cannot read {mime} content: PDFs, images and other binary files are not supported")
            body = _Body(resp.getheader("Content-Encoding", ""), lim.max_bytes)
            raw_read = 0
            while not body.full():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ToolFault(f"page took longer than {lim.total_timeout:g} s to download")
                conn.pinned_sock.settimeout(min(lim.read_timeout, left))
                # read1: at most one recv, so the deadline is checked between small reads
                chunk = resp.read1(65536)
                if not chunk:
                    break
                raw_read += len(chunk)
                body.feed(chunk)
                if raw_read >= lim.max_bytes and not body.full():
                    body.truncated = True  # compressed stream itself over the cap
                    break
            if not body.truncated and resp.length:  # closed before the Content-Length it announced
                raise ToolFault(f"connection to {target.host} closed after {raw_read} of "
                                f"{raw_read + resp.length} bytes")
            return status, None, Response(url, status, mime, charset, body.bytes(), body.truncated)
        except (TimeoutError, socket.timeout) as e:
            if time.monotonic() >= deadline - 0.05:  # the read was cut short by the deadline
                raise ToolFault(f"page took longer than {lim.total_timeout:g} s to download") from e
            raise ToolFault(f"timed out reading {target.host} (no data for {lim.read_timeout:g} s)") from e
        except ssl.SSLCertVerificationError as e:
            raise FetchError(f"TLS certificate of {target.host} not valid: {e.verify_message}") from e
        except (http.client.HTTPException, ConnectionError) as e:
            raise ToolFault(f"connection to {target.host} failed ({type(e).__name__}: {e})") from e
        except OSError as e:
            raise ToolFault(f"network error with {target.host} ({e})") from e


# --- bytes -> text ------------------------------------------------------------------------------

def _codec(name: str | None) -> str | None:
    if not name:
        return None
    try:
        return codecs.lookup(name).name
    except LookupError:
        return None


def decode(body: bytes, charset: str | None, html: bool) -> str:
    """Bytes to str: the declared charset, a <meta charset> (html), else UTF-8 with replacement."""
    enc = _codec(charset)
    if enc is None and html:
        m = re.search(rb"<meta[^>]+charset\s*=\s*[\"']?([\w.:-]+)", body[:4096], re.I)
        enc = _codec(m.group(1).decode("ascii", "ignore")) if m else None
    return body.decode(enc or "utf-8", errors="replace")


def sniff_kind(mime: str, body: bytes) -> str:
    """`html`, `text`, or `binary` for a response body."""
    if mime in HTML_TYPES:
        return "html"
    if mime.startswith("text/") or mime in TEXT_TYPES or mime.endswith(("+json", "+xml")):
        return "html" if mime.endswith("+xml") else "text"
    head = body[:2048]
    if head.startswith(b"%PDF") or b"\x00" in head:
        return "binary"
    low = head.lstrip().lower()
    if low.startswith((b"<!doctype html", b"<html", b"<?xml")) or b"<body" in low or b"<head" in low:
        return "html"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 4:  # not just a character cut at the 2 KB boundary
            return "binary"
    return "text"


def page_text(resp: Response) -> str:
    """The readable text of a page (trafilatura for HTML; plain text as is). Raises FetchError."""
    kind = sniff_kind(resp.content_type, resp.body)
    if kind == "binary":
        raise FetchError(f"cannot read {resp.content_type or 'binary'} content: "
                         "PDFs, images and other binary files are not supported")
    text = decode(resp.body, resp.charset, kind == "html")
    if kind == "html":
        import trafilatura  # ~0.2 s import: only when a page is actually read
        extracted = trafilatura.extract(text, url=resp.url, include_comments=False, include_tables=True)
        if not extracted:  # trafilatura finds no main content in short or odd pages
            extracted = trafilatura.html2txt(text)
        text = extracted or ""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    return re.sub(r"\n{3,}", "\n\n", text).strip()
