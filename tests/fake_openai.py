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
- `("status", code, obj)`: that HTTP status with `obj` as the JSON body verbatim (a server's own
  error format, e.g. FastAPI's `{"detail": "..."}` as `transformers serve` sends it).
- `Exception` instance: raised inside the handler -> the connection is closed with no reply.

Instead of a callable, `responder` may be a constant (any value above) or a `list` of values
consumed one per request in order (the last one repeats), e.g. `[500, 500, "[1, 2]"]`.
`server.responder` can be reassigned between requests.

`GET /v1/models` lists the base model (`server.model_name`) and every loaded LoRA adapter.
Every request (POST and GET) is recorded in `server.requests` as a `Recorded` with
`method`, `path`, `headers` (a plain dict, as sent), `json` (None for GET or bad JSON) and `raw`.

Policy updates (the routes atomcli.engines.policy_sync drives; they change what the fake serves,
so a responder can answer as the old or the new policy: `server.policy_for(body["model"])` is the
adapter path, or the base weights' path, that would answer a request for that model name):

- vLLM runtime LoRA (`runtime_lora=True`, as with VLLM_ALLOW_RUNTIME_LORA_UPDATING): `POST
  /v1/load_lora_adapter {lora_name, lora_path}` (400 if the name is taken or the path is no
  folder; 200 with vLLM's text body), `POST /v1/unload_lora_adapter {lora_name}`.
- SGLang: `POST /update_weights_from_disk {model_path, weight_version?}` -> `{success, message,
  num_paused_requests}` (400, success false, for a missing path); `GET /model_info` and the older
  `GET /get_model_info` -> `{model_path, weight_version, is_generation}`.
- transformers serve: `POST /load_model {model}` loads a local model folder (one with config.json) and
  serves it under its path (kept in `server.adapters`, path -> path); the answer is its event stream,
  `data: {"status": "loading"}` then `{"status": "ready"}` or `{"status": "error", "message"}`.
- vLLM dev mode (`dev_mode=True`, as with VLLM_SERVER_DEV_MODE=1): `POST /collective_rpc {method:
  "reload_weights", kwargs: {weights_path}}`, `POST /update_weight_version {new_version}`, `GET
  /weight_info` -> `{weight_version}`.

`server.weights` (starts as `model_name`), `server.weight_version` (starts "default") and
`server.adapters` ({name: path}) hold that state; `server.updates` lists (route, body) of each
update in order. With `strict_models=True` a completion for a model name the server does not
serve gets vLLM's 404, as a real server would answer a stale adapter name.
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

    def __init__(self, responder: Any = "", *, model_name: str = "fake-model", runtime_lora: bool = True,
                 dev_mode: bool = True, strict_models: bool = False):
        self.responder = responder
        self.model_name = model_name
        self.runtime_lora, self.dev_mode, self.strict_models = runtime_lora, dev_mode, strict_models
        self.weights = model_name
        self.weight_version = "default"
        self.adapters: dict[str, str] = {}
        self.updates: list[tuple[str, Any]] = []
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

    # --- what it serves ---------------------------------------------------------------------

    def policy_for(self, model: Any) -> str | None:
        """The adapter path or base weights that answer a request for `model` (None: not served)."""
        with self._lock:
            if model in self.adapters:
                return self.adapters[model]
            if model == self.model_name or not self.strict_models:
                return self.weights
            return None

    def served_models(self) -> list[dict]:
        with self._lock:
            return [{"id": self.model_name, "object": "model", "owned_by": "fake", "root": self.weights,
                     "parent": None}] + [{"id": n, "object": "model", "owned_by": "fake", "root": p,
                                          "parent": self.model_name} for n, p in self.adapters.items()]

    def _update(self, route: str, body: Any) -> tuple[int, Any]:
        """A policy-changing request -> (status, JSON object or text), or (0, None): not such a route."""
        import os
        if route == "/v1/load_lora_adapter" and self.runtime_lora:
            name, path = body.get("lora_name"), body.get("lora_path")
            with self._lock:
                if name in self.adapters:
                    return 400, {"error": {"message": f"The lora adapter '{name}' has already been loaded.",
                                           "code": 400}}
                if not isinstance(path, str) or not os.path.isdir(path):
                    return 400, {"error": {"message": f"No adapter found for {path}", "code": 400}}
                self.adapters[name] = path
                self.updates.append((route, body))
            return 200, f"Success: LoRA adapter '{name}' added successfully."
        if route == "/v1/unload_lora_adapter" and self.runtime_lora:
            name = body.get("lora_name")
            with self._lock:
                if self.adapters.pop(name, None) is None:
                    return 404, {"error": {"message": f"The lora adapter '{name}' cannot be found.", "code": 404}}
                self.updates.append((route, body))
            return 200, f"Success: LoRA adapter '{name}' removed successfully."
        if route == "/update_weights_from_disk":
            path = body.get("model_path")
            if not isinstance(path, str) or not os.path.exists(path):
                return 400, {"success": False, "message": f"Failed to get weights iterator: {path}",
                             "num_paused_requests": 0}
            with self._lock:
                self.weights = path
                if body.get("weight_version") is not None:
                    self.weight_version = str(body["weight_version"])
                self.updates.append((route, body))
            return 200, {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}
        if route == "/collective_rpc" and self.dev_mode:
            if body.get("method") != "reload_weights":
                return 500, {"error": {"message": f"no method {body.get('method')}", "code": 500}}
            path = (body.get("kwargs") or {}).get("weights_path")
            if not isinstance(path, str) or not os.path.exists(path):
                return 500, {"error": {"message": f"cannot load {path}", "code": 500}}
            with self._lock:
                self.weights = path
                self.updates.append((route, body))
            return 200, {"results": [None]}
        if route == "/load_model":  # transformers serve: a model per local path, its progress as server-sent events
            path = body.get("model")
            if not isinstance(path, str) or not os.path.isfile(os.path.join(path, "config.json")):
                event = {"status": "error", "model": path, "message": f"Unrecognized model in {path}."}
            else:
                with self._lock:
                    self.adapters[path] = path  # listed by /v1/models and answering under its path
                    self.updates.append((route, body))
                event = {"status": "ready", "model": path, "cached": False}
            return 200, f'data: {json.dumps({"status": "loading", "model": path})}\n\ndata: {json.dumps(event)}\n\n'
        if route == "/update_weight_version" and self.dev_mode:
            with self._lock:
                self.weight_version = str(body.get("new_version"))
                self.updates.append((route, body))
            return 200, {"success": True, "new_version": self.weight_version}
        return 0, None

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
        route = self.path.split("?")[0].rstrip("/")
        owner = self.owner
        if route.endswith("/models"):
            self._send_json(200, {"object": "list", "data": owner.served_models()})
        elif route in ("/model_info", "/get_model_info"):
            self._send_json(200, {"model_path": owner.weights, "weight_version": owner.weight_version,
                                  "is_generation": True})
        elif route == "/weight_info" and owner.dev_mode:
            self._send_json(200, {"weight_version": owner.weight_version})
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
        status, answer = self.owner._update(self.path.split("?")[0].rstrip("/"), body) \
            if isinstance(body, dict) else (0, None)
        if status:
            if isinstance(answer, str):
                self._send_text(status, answer)
            else:
                self._send_json(status, answer)
            return
        if isinstance(body, dict) and self.owner.policy_for(body.get("model")) is None:
            self._send_error(404, f"The model `{body.get('model')}` does not exist.")
            return
        reply = self.owner._next_reply(body, self.path)
        self._answer(reply, body)

    def _answer(self, reply: Any, body: dict) -> None:
        if isinstance(reply, tuple) and reply and reply[0] == "sleep":
            time.sleep(float(reply[1]))
            reply = reply[2] if len(reply) > 2 else ""
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, tuple) and len(reply) == 3 and reply[0] == "status":
            self._send_json(int(reply[1]), reply[2])
            return
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

    def _send_text(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
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
