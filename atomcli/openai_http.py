"""One JSON POST (or GET) to an OpenAI-compatible endpoint, shared by the judge, the rollout engine
and the policy sync (atomcli.engines.policy_sync).

Owns what every client must do the same way: the request itself (stdlib HTTP, JSON body,
optional Bearer key), the classification of failures (timeouts, connection errors, HTTP 429
and 5xx are transient: `retry.ToolFault`, with the server's Retry-After; any other HTTP
status concerns this one request: the caller's permanent error type), a cap on the size of
the response (a server streaming more is broken or hostile, and reading it whole would hold
it all in memory), and that the key never appears in a message: every message raised here
passes through `redact`. Parsing the reply is the caller's business.

Redirects: urllib would follow a 301/302/303 to any host as a GET *with the Authorization
header*, and put that host's answer in our messages. Here no redirect is followed by urllib;
a 307/308 to the same scheme, host and port (a trailing-slash redirect) is followed with the
same POST, and any other redirect is a permanent error that names the other host only: the
key goes to the configured host and nowhere else, and no other host's body is read.
"""

from __future__ import annotations

import http.client
import json
import socket
import urllib.error
import urllib.parse
import urllib.request

from atomcli import retry

REDIRECT_CODES = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 3


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx comes back as HTTPError (handled in `post_json`) instead of being followed."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def _origin(url: str) -> tuple[str, str, int | None]:
    p = urllib.parse.urlsplit(url)
    try:
        port = p.port or {"http": 80, "https": 443}.get(p.scheme.lower())
    except ValueError:
        port = None
    return p.scheme.lower(), (p.hostname or "").lower(), port


def post_json(url: str, body: bytes, *, key: str | None, timeout: float, max_bytes: int, what: str,
              permanent_error: type[Exception]) -> bytes:
    """POST `body` (JSON) to `url`; the raw response body, at most `max_bytes` long.

    Raises `retry.ToolFault` for transient faults and `permanent_error(message)` otherwise;
    `what` names the server in messages ("judge", "policy server").
    """
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    origin = _origin(url)
    for _hop in range(MAX_REDIRECTS + 1):
        target = _post_once(url, body, headers, timeout=timeout, max_bytes=max_bytes, what=what, key=key,
                            permanent_error=permanent_error)
        if isinstance(target, bytes):
            return target
        code, location = target
        new = urllib.parse.urljoin(url, location)
        if code in (307, 308) and _origin(new) == origin:
            url = new  # same server, same method and body: the key stays where it was configured
            continue
        host = urllib.parse.urlsplit(new).netloc.rpartition("@")[2] or "(no host)"
        why = f"to another server ({host})" if _origin(new) != origin else "that would turn the POST into a GET"
        raise permanent_error(f"{what} answered HTTP {code}, a redirect {why}; not followed: the API key goes to "
                              f"{origin[1]} only (set the base url to the server's real address)")
    raise permanent_error(f"{what} redirected more than {MAX_REDIRECTS} times")


def get_json(url: str, *, key: str | None, timeout: float, max_bytes: int, what: str,
             permanent_error: type[Exception]) -> bytes:
    """GET `url` (a server's state: its models, its weight version); the raw response body.

    Faults as in `post_json`; a redirect is never followed (a permanent error naming the status)."""
    headers = {"Accept": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    got = _post_once(url, None, headers, timeout=timeout, max_bytes=max_bytes, what=what, key=key,
                     permanent_error=permanent_error, method="GET")
    if isinstance(got, bytes):
        return got
    raise permanent_error(f"{what} answered HTTP {got[0]}, a redirect; not followed (set the base url to the "
                          "server's real address)")


def _post_once(url: str, body: bytes | None, headers: dict, *, timeout: float, max_bytes: int, what: str,
               key: str | None, permanent_error: type[Exception], method: str = "POST") -> bytes | tuple[int, str]:
    """One request (POST unless `method`): the body, or (status, Location) of a redirect, never followed here."""
    req = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            raw = resp.read(max_bytes + 1)
    except urllib.error.HTTPError as e:
        if e.code in REDIRECT_CODES:
            location = e.headers.get("Location") or ""
            e.close()  # the redirecting response's body is never read
            if not location:
                raise permanent_error(f"HTTP {e.code} redirect from {what} without a Location header") from None
            return e.code, location.strip()
        msg = redact(f"HTTP {e.code} from {what}: {_error_detail(e)}", key)
        if e.code == 429 or e.code >= 500:
            raise retry.ToolFault(msg, status=e.code,
                                  retry_after=retry.parse_retry_after(e.headers.get("Retry-After"))) from None
        raise permanent_error(msg) from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, (TimeoutError, socket.timeout)):
            raise retry.ToolFault(f"{what} timed out after {timeout:g} s") from None
        raise retry.ToolFault(redact(f"cannot reach {what} at {url}: {e.reason}", key)) from None
    except (TimeoutError, socket.timeout):
        raise retry.ToolFault(f"{what} timed out after {timeout:g} s") from None
    except (ConnectionError, http.client.HTTPException, OSError) as e:
        raise retry.ToolFault(redact(f"connection to {what} failed: {type(e).__name__}: {e}", key)) from None
    if len(raw) > max_bytes:
        raise permanent_error(f"{what} response is larger than {_size(max_bytes)}")
    return raw


def redact(text: str, key: str | None) -> str:
    """`text` with the API key replaced by `***` (a server may echo it back in any reply)."""
    return text.replace(key, "***") if key else text


def _size(n: int) -> str:
    return f"{n >> 20} MB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n >> 10} KB"


def _error_detail(e: urllib.error.HTTPError) -> str:
    """The server's own error message, short; the reason phrase when the body says nothing usable."""
    try:
        raw = e.read(2000)
        obj = json.loads(raw)
        err = obj.get("error")
        msg = err.get("message") if isinstance(err, dict) else err
        if not msg:  # FastAPI servers (transformers serve): {"detail": "..."} or a list of validation errors
            detail = obj.get("detail")
            msg = "; ".join(str(d.get("msg", d)) if isinstance(d, dict) else str(d) for d in detail) \
                if isinstance(detail, list) else detail
        return str(msg or raw[:200])[:300]
    except Exception:  # any body at all: the status code alone still says enough
        return str(e.reason)[:200]
