"""A programmable OpenAI-compatible HTTP server for tests (no network, no dependencies).

Usage::

    from fake_openai import FakeOpenAI            # tests/ is on sys.path under pytest (no __init__.py)

    def responder(body, path):                    # body: the parsed request JSON, path: "/v1/chat/completions"
        return '[7, 3]'                           # -> a chat.completion (or text_completion) with that content

    with FakeOpenAI(responder) as server:         # binds 127.0.0.1 on a free port, serves in a thread
        client_under_test(server.base_url)        # "http://127.0.0.1:PORT/v1"
        assert server.requests[0].json["model"] == "m"
        assert server.requests[0].headers["Authorization"] == "Bearer sk-test"

What a responder may return (it is called once per POST request, from the handler thread):

- `str`: the content of one choice, wrapped as a `chat.completion` for `/chat/completions`
  or as a `text_completion` (`choices[0].text`) for `/completions`. With `"stream": true` in
  the request it is sent as server-sent events (one delta chunk, then `data: [DONE]`).
- `list[str]`: several choices (as when the request asks for `n > 1`).
- `dict`: sent verbatim as the JSON response body (status 200), e.g. to return logprobs.
- `int`: that HTTP status with an OpenAI-style error body (e.g. 429, 500, 401).
- `("sleep", seconds)` or `("sleep", seconds, then)`: wait before answering, to make the
  client time out; afterwards `then` (any of the above, default `""`) is answered if the
  client is still listening.
- `Exception` instance: raised inside the handler -> the connection is closed with no reply.

Instead of a callable, `responder` may be a constant (any value above) or a `list` of values
consumed one per request in order (the last one repeats), e.g. `[500, 500, "[1, 2]"]`.
`server.responder` can be reassigned between requests.

`GET /v1/models` lists one model (`server.model_name`) so that health checks work.
Every request (POST and GET) is recorded in `server.requests` as a `Recorded` with
`method`, `path`, `headers` (a plain dict, as sent), `json` (None for GET or bad JSON) and `raw`.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict
    json: Any
    raw: bytes


class FakeOpenAI:
    """An OpenAI-compatible server on 127.0.0.1 for the duration of a `with` block."""

    def __init__(self, responder: Any = "", *, model_name: str = "fake-model"):
        self.responder = responder
        self.model_name = model_name
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._calls = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._port: int | None = None  # kept after stop(): a test may want a dead address
        self._thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> "FakeOpenAI":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        server = self

        class Handler(_Handler):
            owner = server

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # Sleeping handlers must not keep the test waiting at shutdown.
        httpd.daemon_threads = True
        httpd.block_on_close = False
        self._httpd = httpd
        self._port = httpd.server_address[1]
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True, name="fake-openai")
        self._thread.start()

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    @property
    def port(self) -> int:
        assert self._port is not None, "server not started"
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # --- what the handler asks --------------------------------------------------------------

    def _record(self, rec: Recorded) -> None:
        with self._lock:
            self.requests.append(rec)

    def _next_reply(self, body: Any, path: str) -> Any:
        with self._lock:
            index = self._calls
            self._calls += 1
            responder = self.responder
        if isinstance(responder, list):
            return responder[min(index, len(responder) - 1)] if responder else ""
        if callable(responder):
            return responder(body, path)
        return responder


class _Handler(BaseHTTPRequestHandler):
    owner: FakeOpenAI
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:
        self.owner._record(Recorded("GET", self.path, dict(self.headers.items()), None, b""))
        if self.path.rstrip("/").endswith("/models"):
            self._send_json(200, {"object": "list", "data": [
                {"id": self.owner.model_name, "object": "model", "owned_by": "fake"}]})
        else:
            self._send_error(404, f"no route {self.path}")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        self.owner._record(Recorded("POST", self.path, dict(self.headers.items()), body, raw))
        if body is None:
            self._send_error(400, "request body is not JSON")
            return
        reply = self.owner._next_reply(body, self.path)
        self._answer(reply, body)

    def _answer(self, reply: Any, body: dict) -> None:
        if isinstance(reply, tuple) and reply and reply[0] == "sleep":
            time.sleep(float(reply[1]))
            reply = reply[2] if len(reply) > 2 else ""
        if isinstance(reply, BaseException):
            raise reply
        try:
            if isinstance(reply, bool):
                raise TypeError("responder returned a bool")
            if isinstance(reply, int):
                self._send_error(reply, f"fake error {reply}")
            elif isinstance(reply, dict):
                self._send_json(200, reply)
            elif isinstance(reply, (str, list)):
                contents = [reply] if isinstance(reply, str) else [str(c) for c in reply]
                if body.get("stream"):
                    self._send_stream(contents, body)
                else:
                    self._send_json(200, _completion(self.path, contents, body, self.owner.model_name))
            else:
                raise TypeError(f"responder returned {type(reply).__name__}")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (e.g. it timed out while we slept)

    def _send_json(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, status: int, message: str) -> None:
        self._send_json(status, {"error": {"message": message, "type": "fake_error", "code": status}})

    def _send_stream(self, contents: list[str], body: dict) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        chat = self.path.rstrip("/").endswith("/chat/completions")
        for i, text in enumerate(contents):
            choice = ({"index": i, "delta": {"role": "assistant", "content": text}, "finish_reason": None}
                      if chat else {"index": i, "text": text, "finish_reason": None})
            chunk = {"id": "fake-stream", "object": "chat.completion.chunk" if chat else "text_completion",
                     "model": body.get("model", self.owner.model_name), "choices": [choice]}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True


def _completion(path: str, contents: list[str], body: dict, default_model: str) -> dict:
    """The response object the real API returns for a chat or a plain completion."""
    model = body.get("model", default_model)
    usage = {"prompt_tokens": 0, "completion_tokens": sum(len(c.split()) for c in contents)}
    usage["total_tokens"] = usage["completion_tokens"]
    if path.rstrip("/").endswith("/chat/completions"):
        choices = [{"index": i, "message": {"role": "assistant", "content": c}, "finish_reason": "stop"}
                   for i, c in enumerate(contents)]
        return {"id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
                "model": model, "choices": choices, "usage": usage}
    choices = [{"index": i, "text": c, "finish_reason": "stop", "logprobs": None}
               for i, c in enumerate(contents)]
    return {"id": "cmpl-fake", "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": choices, "usage": usage}


Responder = Callable[[Any, str], Any]
