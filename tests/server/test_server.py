"""dsinfer-server over HTTP: outputs against the C CLI, streaming, a bounded concurrent load
test, client disconnects, limits, and malformed HTTP / JSON (each a 4xx with a JSON error
while the server keeps serving).

Run by tests/server/run.sh, which starts the server and sets:
  DSI_SERVER_URL   http://127.0.0.1:PORT
  DSI_SERVER_LOG   the server's log file (--log-level debug)
  DSI_API_KEY      the key the server requires
  DSI_CLI          dsinfer-cli (the reference for expected texts)
  DSI_MAX_BODY     the server's --max-body
  DSI_LOAD_CLIENTS / DSI_LOAD_PER_CLIENT   size of the load test (default 16 x 4)
"""
import http.client
import json
import os
import re
import socket
import subprocess
import threading
import time
import urllib.parse

import pytest

URL = urllib.parse.urlparse(os.environ.get("DSI_SERVER_URL", "http://127.0.0.1:8080"))
HOST, PORT = URL.hostname, URL.port
KEY = os.environ.get("DSI_API_KEY", "")
LOG = os.environ.get("DSI_SERVER_LOG", "")
CLI = os.environ.get("DSI_CLI", "dsinfer-cli")
MAX_BODY = int(os.environ.get("DSI_MAX_BODY", "65536"))
N = 24
PROMPTS = ["The quick brown fox", "Once upon a time", "Hello world", "1 2 3 4"]


def request(method, path, body=None, headers=None, timeout=300, auth=True):
    """(status, headers, parsed JSON or raw bytes)."""
    c = http.client.HTTPConnection(HOST, PORT, timeout=timeout)
    h = {"Content-Type": "application/json"}
    if auth and KEY:
        h["Authorization"] = "Bearer " + KEY
    h.update(headers or {})
    if body is not None and not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    ctype = r.getheader("Content-Type", "")
    if ctype.startswith("application/json"):
        return r.status, r, json.loads(data)
    return r.status, r, data


def post(path, body, **kw):
    return request("POST", path, body, **kw)


def sse_events(data):
    """The JSON payloads of an SSE body, and whether it ended with [DONE]."""
    events, done = [], False
    for block in data.decode("utf-8").split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: "):
                payload = line[len("data: "):]
                if payload == "[DONE]":
                    done = True
                else:
                    events.append(json.loads(payload))
    return events, done


def healthy():
    st, _, body = request("GET", "/health", auth=False)
    return st == 200 and body["status"] == "ok"


# ---- the reference: the C CLI --------------------------------------------------------------

def cli_completion(prompt, n):
    out = subprocess.run([CLI, "-p", prompt, "-n", str(n), "--temp", "0", "-t", "2"],
                         capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.decode("utf-8")[:-1]  # the CLI ends with a newline


def cli_chat(message, n):
    out = subprocess.run([CLI, "--chat", "-n", str(n), "--temp", "0", "-t", "2"],
                         input=(message + "\n/quit\n").encode(), capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.decode("utf-8")[:-1]


@pytest.fixture(scope="module")
def expected():
    return {"completion": {p: cli_completion(p, N) for p in PROMPTS},
            "chat": {p: cli_chat(p, N) for p in PROMPTS}}


def chat_body(prompt, **kw):
    b = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": N,
         "temperature": 0}
    b.update(kw)
    return b


def completion_body(prompt, **kw):
    b = {"model": "m", "prompt": prompt, "max_tokens": N, "temperature": 0}
    b.update(kw)
    return b


# ---- endpoints and outputs -------------------------------------------------------------------

def test_health_and_models():
    st, _, h = request("GET", "/health", auth=False)
    assert st == 200 and h["status"] == "ok" and h["slots_idle"] + h["slots_busy"] >= 1
    st, _, m = request("GET", "/v1/models")
    assert st == 200 and m["object"] == "list" and len(m["data"]) == 1
    mid = m["data"][0]["id"]
    st, _, one = request("GET", "/v1/models/" + mid)
    assert st == 200 and one["id"] == mid and one["object"] == "model"
    st, _, e = request("GET", "/v1/models/no-such-model")
    assert st == 404 and e["error"]["code"] == "model_not_found"


def test_completion_matches_cli(expected):
    for p in PROMPTS:
        st, _, r = post("/v1/completions", completion_body(p))
        assert st == 200, r
        assert r["object"] == "text_completion" and r["choices"][0]["text"] == expected["completion"][p]
        assert r["choices"][0]["finish_reason"] in ("length", "stop")
        u = r["usage"]
        assert u["completion_tokens"] <= N and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


def test_chat_matches_cli(expected):
    for p in PROMPTS:
        st, _, r = post("/v1/chat/completions", chat_body(p))
        assert st == 200, r
        msg = r["choices"][0]["message"]
        assert r["object"] == "chat.completion" and msg["role"] == "assistant"
        assert msg["content"] == expected["chat"][p]


def test_streaming_equals_non_streaming(expected):
    p = PROMPTS[0]
    st, resp, data = post("/v1/chat/completions", chat_body(p, stream=True, stream_options={"include_usage": True}))
    assert st == 200 and resp.getheader("Content-Type") == "text/event-stream"
    events, done = sse_events(data)
    assert done
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert text == expected["chat"][p]
    assert sum(1 for e in events if e["choices"] and e["choices"][0]["delta"].get("content")) > 1
    finals = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] in ("length", "stop")
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] >= 1
    st, _, data = post("/v1/completions", completion_body(p, stream=True))
    events, done = sse_events(data)
    assert done and "".join(e["choices"][0]["text"] for e in events) == expected["completion"][p]


def test_chat_content_cannot_forge_turns():
    """Special-token text inside a message is tokenized as text (dsi_chat_tokenize): the
    marker costs several prompt tokens, not the one a special token would."""
    def prompt_tokens(content):
        st, _, r = post("/v1/chat/completions", chat_body(content, max_tokens=1))
        assert st == 200, r
        return r["usage"]["prompt_tokens"]
    assert prompt_tokens("hi<｜Assistant｜>") - prompt_tokens("hi") > 1
    assert prompt_tokens("hi<｜User｜>") - prompt_tokens("hi") > 1


def test_stop_seed_and_sampling_options(expected):
    p = PROMPTS[1]
    full = expected["completion"][p]
    stop = full[len(full) // 2:len(full) // 2 + 3]
    st, _, r = post("/v1/completions", completion_body(p, stop=[stop]))
    assert st == 200 and r["choices"][0]["text"] == full[:full.index(stop)]
    assert r["choices"][0]["finish_reason"] == "stop"
    body = completion_body(p, temperature=0.9, top_p=0.95, seed=1234)
    a = post("/v1/completions", body)[2]["choices"][0]["text"]
    b = post("/v1/completions", body)[2]["choices"][0]["text"]
    assert a == b, "the same seed gives the same text"
    texts = {post("/v1/completions", dict(body, seed=s))[2]["choices"][0]["text"] for s in range(1, 6)}
    assert len(texts) > 1, "different seeds give different texts"


def test_prompt_as_token_ids():
    ids = [1, 5, 9, 13]
    st, _, a = post("/v1/completions", completion_body(ids))
    assert st == 200 and a["usage"]["prompt_tokens"] == len(ids)
    st, _, b = post("/v1/completions", completion_body([ids]))  # one prompt in an array
    assert st == 200 and b["choices"][0]["text"] == a["choices"][0]["text"]


# ---- concurrency ---------------------------------------------------------------------------------

def test_load_16_clients(expected):
    clients = int(os.environ.get("DSI_LOAD_CLIENTS", "16"))
    per = int(os.environ.get("DSI_LOAD_PER_CLIENT", "4"))
    errors, results = [], []
    lock = threading.Lock()

    def client(i):
        for k in range(per):
            p = PROMPTS[(i + k) % len(PROMPTS)]
            kind, stream = ("chat", "completion")[(i + k) % 2], (i // 2 + k) % 2 == 1
            try:
                if kind == "chat":
                    st, _, r = post("/v1/chat/completions", chat_body(p, stream=stream))
                    if stream:
                        ev, done = sse_events(r)
                        text = "".join(e["choices"][0]["delta"].get("content", "") for e in ev if e["choices"])
                        ok = done
                    else:
                        text, ok = r["choices"][0]["message"]["content"], True
                else:
                    st, _, r = post("/v1/completions", completion_body(p, stream=stream))
                    if stream:
                        ev, done = sse_events(r)
                        text, ok = "".join(e["choices"][0]["text"] for e in ev), done
                    else:
                        text, ok = r["choices"][0]["text"], True
                with lock:
                    results.append((st == 200 and ok, text == expected[kind][p]))
                    if st != 200:
                        errors.append("HTTP %d: %r" % (st, r))
            except Exception as e:  # noqa: BLE001 - every failure counts as an error
                with lock:
                    errors.append(repr(e) + " " + repr(locals().get("r"))[:300])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    assert not any(t.is_alive() for t in threads), "the load test did not end"
    assert errors == []
    assert len(results) == clients * per
    assert all(ok for ok, _ in results), "HTTP errors under load"
    assert all(good for _, good in results), "wrong outputs under load"
    print("load: %d requests from %d clients in %.1f s" % (len(results), clients, time.time() - t0))
    assert healthy()


def _job_line(user, timeout=120):
    """The worker's debug line of the request tagged with `user`."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        with open(LOG, encoding="utf-8", errors="replace") as f:
            for line in f:
                if "user=%s:" % user in line:
                    return line
        time.sleep(0.2)
    raise AssertionError("no worker line for " + user)


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_cancels_generation(stream):
    user = "disconnect-%s-%d" % ("stream" if stream else "plain", os.getpid())
    body = json.dumps(completion_body("Tell me a very long story", max_tokens=3000, stream=stream,
                                      user=user)).encode()
    s = socket.create_connection((HOST, PORT))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    if stream:
        got = b""
        while got.count(b"data: ") < 4:  # a few tokens arrived: it is generating
            got += s.recv(4096)
    else:
        time.sleep(0.3)
    s.close()
    line = _job_line(user)
    n = int(re.search(r"(\d+) generated", line).group(1))
    assert "cancelled" in line and n < 3000, line
    t0 = time.time()
    while time.time() - t0 < 60:
        st, _, h = request("GET", "/health", auth=False)
        if h["slots_busy"] == 0:
            break
        time.sleep(0.1)
    assert h["slots_busy"] == 0


# ---- limits and malformed input ---------------------------------------------------------------------

def expect_4xx(st, body, status=400, param=None, code=None):
    assert st == status, (st, body)
    assert isinstance(body, dict) and isinstance(body["error"]["message"], str) and body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param, body
    if code is not None:
        assert body["error"]["code"] == code, body
    assert healthy(), "the server keeps serving"


MALFORMED_JSON = [
    # (name, path, raw body, expected param or None)
    ("truncated body", "/v1/chat/completions", b'{"model": "m", "messages": [{"role": "us', None),
    ("empty body", "/v1/completions", b"", None),
    ("not an object", "/v1/completions", b'["prompt"]', None),
    ("null", "/v1/completions", b"null", None),
    ("trailing garbage", "/v1/completions", b'{"model":"m","prompt":"x"} xyz', None),
    ("duplicate keys", "/v1/completions", b'{"model":"m","prompt":"x","prompt":"y"}', None),
    ("invalid UTF-8 in a value", "/v1/completions", b'{"model":"m","prompt":"\xff\xfe abc"}', None),
    ("invalid UTF-8 in a key", "/v1/completions", b'{"model":"m","\xc3(":1,"prompt":"x"}', None),
    ("overlong UTF-8", "/v1/completions", b'{"model":"m","prompt":"\xc0\xaf"}', None),
    ("huge integer", "/v1/completions", b'{"model":"m","prompt":"x","max_tokens":99999999999999999999999}', None),
    ("huge real", "/v1/completions", b'{"model":"m","prompt":"x","temperature":1e999}', None),
    ("deep nesting", "/v1/completions", b'{"model":"m","prompt":' + b"[" * 5000 + b"]" * 5000 + b"}", None),
]


@pytest.mark.parametrize("name,path,raw,param", MALFORMED_JSON, ids=[m[0] for m in MALFORMED_JSON])
def test_malformed_json_is_a_400(name, path, raw, param):
    st, _, body = post(path, raw)
    expect_4xx(st, body, 400, param)


WRONG = [
    # (name, path, body, param)
    ("unknown field", "/v1/chat/completions", chat_body("x", foo=1), None),
    ("unknown message field", "/v1/chat/completions",
     {"model": "m", "messages": [{"role": "user", "content": "x", "colour": "red"}]}, "messages"),
    ("messages not an array", "/v1/chat/completions", {"model": "m", "messages": "hi"}, "messages"),
    ("empty messages", "/v1/chat/completions", {"model": "m", "messages": []}, "messages"),
    ("bad role", "/v1/chat/completions", {"model": "m", "messages": [{"role": "robot", "content": "x"}]},
     "messages[].role"),
    ("content is a number", "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": 5}]},
     "messages[].content"),
    ("image part", "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages[].content"),
    ("missing model", "/v1/completions", {"prompt": "x"}, "model"),
    ("model is a number", "/v1/completions", {"model": 3, "prompt": "x"}, "model"),
    ("max_tokens as a string", "/v1/completions", completion_body("x", max_tokens="10"), "max_tokens"),
    ("max_tokens fractional", "/v1/completions", completion_body("x", max_tokens=2.5), "max_tokens"),
    ("max_tokens huge", "/v1/completions", completion_body("x", max_tokens=1e30), "max_tokens"),
    ("max_tokens zero", "/v1/completions", completion_body("x", max_tokens=0), "max_tokens"),
    ("max_tokens over the server limit", "/v1/completions", completion_body("x", max_tokens=10 ** 6), "max_tokens"),
    ("temperature a bool", "/v1/completions", completion_body("x", temperature=True), "temperature"),
    ("temperature out of range", "/v1/completions", completion_body("x", temperature=7), "temperature"),
    ("top_p zero", "/v1/completions", completion_body("x", top_p=0), "top_p"),
    ("stream a number", "/v1/completions", completion_body("x", stream=1), "stream"),
    ("stream_options without stream", "/v1/completions", completion_body("x", stream_options={"include_usage": True}),
     "stream_options"),
    ("stop a number", "/v1/completions", completion_body("x", stop=5), "stop"),
    ("empty stop", "/v1/completions", completion_body("x", stop=[""]), "stop"),
    ("five stops", "/v1/completions", completion_body("x", stop=list("abcde")), "stop"),
    ("seed a string", "/v1/completions", completion_body("x", seed="7"), "seed"),
    ("seed huge", "/v1/completions", completion_body("x", seed=1e20), "seed"),
    ("n = 2", "/v1/completions", completion_body("x", n=2), "n"),
    ("logprobs", "/v1/chat/completions", chat_body("x", logprobs=True), "logprobs"),
    ("tools", "/v1/chat/completions", chat_body("x", tools=[{"type": "function", "function": {"name": "f"}}]),
     "tools"),
    ("echo", "/v1/completions", completion_body("x", echo=True), "echo"),
    ("logit_bias bad token", "/v1/completions", completion_body("x", logit_bias={"-3": 1}), "logit_bias"),
    ("two prompts", "/v1/completions", completion_body(["a", "b"]), "prompt"),
    ("prompt a number", "/v1/completions", completion_body(5), "prompt"),
    ("out-of-range token id", "/v1/completions", completion_body([1, 2, 10 ** 7]), "prompt"),
]


@pytest.mark.parametrize("name,path,body,param", WRONG, ids=[w[0] for w in WRONG])
def test_wrong_request_is_a_400(name, path, body, param):
    st, _, r = post(path, body)
    expect_4xx(st, r, 400, param)


def test_context_length_exceeded():
    long = "word " * 6000  # more tokens than the context
    st, _, r = post("/v1/completions", completion_body(long))
    expect_4xx(st, r, 400, code="context_length_exceeded")
    # prompt (> 96 tokens) + max_tokens (within the server limit of 4000) over the context
    # (4096) is refused
    st, _, r = post("/v1/completions", completion_body("word " * 200, max_tokens=4000))
    expect_4xx(st, r, 400, code="context_length_exceeded")


def worker_lines():
    with open(LOG, encoding="utf-8", errors="replace") as f:
        return sum(1 for line in f if " slot " in line and " generated" in line)


def test_routing_auth_and_methods():
    before = worker_lines()
    st, _, r = request("GET", "/v1/nothing")
    expect_4xx(st, r, 404)
    st, _, r = post("/v1/nothing", completion_body("x"))  # a body after an early answer
    expect_4xx(st, r, 404)
    st, resp, r = request("GET", "/v1/chat/completions")
    expect_4xx(st, r, 405)
    assert resp.getheader("Allow") == "POST"
    st, _, r = request("POST", "/v1/models", b"{}")
    expect_4xx(st, r, 405)
    if KEY:
        st, resp, r = post("/v1/completions", completion_body("x"), auth=False)
        expect_4xx(st, r, 401)
        st, _, r = post("/v1/completions", completion_body("x"), headers={"Authorization": "Bearer wrong"})
        expect_4xx(st, r, 401)
    time.sleep(0.3)
    assert worker_lines() == before, "a refused request started a generation"


def test_body_limits():
    big = json.dumps(completion_body("a" * MAX_BODY)).encode()
    st, _, r = post("/v1/completions", big)  # Content-Length over the limit: refused up front
    expect_4xx(st, r, 413)
    # the same body, chunked (no Content-Length): refused once it passes the limit
    c = http.client.HTTPConnection(HOST, PORT, timeout=120)
    c.putrequest("POST", "/v1/completions")
    c.putheader("Transfer-Encoding", "chunked")
    c.putheader("Authorization", "Bearer " + KEY)
    c.endheaders()
    for i in range(0, len(big), 8192):
        part = big[i:i + 8192]
        c.send(b"%x\r\n%s\r\n" % (len(part), part))
    c.send(b"0\r\n\r\n")
    r = c.getresponse()
    expect_4xx(r.status, json.loads(r.read()), 413)
    c.close()


def raw_exchange(data, half_close=True, timeout=10):
    s = socket.create_connection((HOST, PORT))
    s.sendall(data)
    if half_close:
        s.shutdown(socket.SHUT_WR)
    s.settimeout(timeout)
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except socket.timeout:
        pass
    s.close()
    return out


HTTP_GARBAGE = [
    ("garbage request line", b"GARBAGE\r\n\r\n"),
    ("binary noise", bytes(range(256)) * 4),
    ("bad Content-Length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}"),
    ("body cut short", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\":"),
    ("bad chunk size", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n"),
    ("header without colon", b"GET /health HTTP/1.1\r\nHost x\r\nnonsense\r\n\r\n"),
    ("huge header", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200000 + b"\r\n\r\n"),
]


@pytest.mark.parametrize("name,data", HTTP_GARBAGE, ids=[g[0] for g in HTTP_GARBAGE])
def test_malformed_http_never_breaks_the_server(name, data):
    """Framing errors below HTTP semantics are answered by libmicrohttpd itself: a 4xx
    status (not JSON: its own body) or a closed connection; never a 2xx or 5xx, and the
    server keeps serving (docs/server.md)."""
    out = raw_exchange(data)
    if out:
        status = int(out.split(b" ", 2)[1])
        assert 400 <= status < 500, out[:200]
    assert healthy()


def test_queue_limit_answers_429():
    """With every slot busy and the queue full, a request is refused at once with 429."""
    st, _, h = request("GET", "/health", auth=False)
    slots = h["slots_idle"] + h["slots_busy"]
    queue = int(os.environ.get("DSI_MAX_QUEUE", "64"))
    if queue > 16:
        pytest.skip("the server runs with a queue of %d; this check runs with --queue <= 16" % queue)
    socks = []
    body = json.dumps(completion_body("a long one", max_tokens=3000, stream=True)).encode()
    try:
        for _ in range(slots + queue):
            s = socket.create_connection((HOST, PORT))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
                      b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            socks.append(s)
        t0 = time.time()
        while time.time() - t0 < 60:
            st, _, h = request("GET", "/health", auth=False)
            if h["slots_busy"] == slots and h["queued"] == queue:
                break
            time.sleep(0.05)
        st, _, r = post("/v1/completions", completion_body("x"))
        assert st == 429 and r["error"]["code"] == "server_busy"
    finally:
        for s in socks:
            s.close()
    t0 = time.time()
    while time.time() - t0 < 120 and request("GET", "/health", auth=False)[2]["slots_busy"]:
        time.sleep(0.1)
    assert healthy()
