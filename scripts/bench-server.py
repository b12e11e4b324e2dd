#!/usr/bin/env python3
"""Aggregate decode throughput of dsinfer-server with 1, 4 and 8 concurrent streaming
clients (docs/server.md "Throughput"). Not a test: a benchmark, run by hand.

    scripts/bench-server.py --server build/bin/dsinfer-server \\
        --model /work/cache/models/bench-v41-q8.gguf --clients 1,4,8

Starts the server on a free loopback port with --parallel = the largest client count, then
for each count C: C clients each send R streaming /v1/completions requests (same prompt,
greedy, max_tokens M, stream_options.include_usage) one after another. Reports the
completion tokens the server counted (usage), the wall time from the first request to the
last [DONE], aggregate tokens/s, per-client tokens/s, mean time to first token, and the
server's CPU time (user + system, /proc) with the tokens per CPU-second: on a machine shared
with other jobs the wall-clock rates follow the share of the CPUs the server's threads get,
while tokens per CPU-second measure the work per token.

--compare also runs every count against a second server started with --no-batch (each
request generated alone, no coalescing) and prints the gain of batching in tokens per
CPU-second, measured in the same run. The two servers run one after the other, never at the same time.
"""
import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time


def stream_request(port, body):
    """(completion tokens, time to first token, total time) of one streamed request."""
    t0 = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, r.read()[:300]))
    ttft, usage, buf = None, None, b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: ") or ev == b"data: [DONE]":
                continue
            e = json.loads(ev[6:])
            if e.get("choices") and e["choices"][0].get("text") and ttft is None:
                ttft = time.monotonic() - t0
            if e.get("usage"):
                usage = e["usage"]
    c.close()
    return usage["completion_tokens"], ttft or 0.0, time.monotonic() - t0


def cpu_seconds(pid):
    """User + system CPU time of a process so far (Linux /proc), in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(port, clients, per_client, max_tokens, prompt):
    results, errors = [], []
    lock = threading.Lock()
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}

    def client(i):
        for _ in range(per_client):
            try:
                r = stream_request(port, body)
                with lock:
                    results.append(r)
            except Exception as e:  # noqa: BLE001
                with lock:
                    errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    tokens = sum(r[0] for r in results)
    return {"clients": clients, "requests": len(results), "errors": len(errors), "tokens": tokens,
            "wall_s": wall, "agg_tps": tokens / wall if wall else 0.0,
            "per_client_tps": sum(r[0] / r[2] for r in results) / max(len(results), 1),
            "ttft_ms": 1000 * sum(r[1] for r in results) / max(len(results), 1)}


def serve(a, counts, extra):
    """Starts a server, runs every client count against it, stops it; returns the rows."""
    tmp = tempfile.mkdtemp()
    port_file, log = os.path.join(tmp, "port"), os.path.join(tmp, "server.log")
    cmd = [a.server, "-m", a.model, "--port", "0", "--port-file", port_file, "--log", log,
           "--parallel", str(max(counts)), "--queue", "0", "--ctx", str(a.ctx)]
    if a.threads:
        cmd += ["-t", str(a.threads)]
    cmd += extra
    t_load = time.monotonic()
    srv = subprocess.Popen(cmd)
    rows = []
    try:
        while not os.path.exists(port_file):
            if srv.poll() is not None:
                sys.exit("the server exited: " + open(log).read()[-2000:])
            time.sleep(0.1)
        port = int(open(port_file).read())
        print("server %s up in %.1f s (model load + %d sessions)" % (
            " ".join(extra) or "(batched)", time.monotonic() - t_load, max(counts)), flush=True)
        run(port, 1, 1, 8, a.prompt)  # warm the page cache and the code paths
        for c in counts:
            cpu0 = cpu_seconds(srv.pid)
            r = run(port, c, a.requests, a.max_tokens, a.prompt)
            r["cpu_s"] = cpu_seconds(srv.pid) - cpu0
            r["tok_per_cpu_s"] = r["tokens"] / r["cpu_s"] if r["cpu_s"] else 0.0
            print("  %d clients: %d tokens in %.1f s = %.2f tok/s; server CPU %.1f s = %.3f tok per CPU-s; %d errors" % (
                c, r["tokens"], r["wall_s"], r["agg_tps"], r["cpu_s"], r["tok_per_cpu_s"], r["errors"]), flush=True)
            rows.append(r)
    finally:
        srv.terminate()
        srv.wait(120)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--clients", default="1,4,8")
    ap.add_argument("--requests", type=int, default=2, help="requests per client (default 2)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0, help="-t of the server (default: all CPUs)")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--prompt", default="The history of the printing press begins")
    ap.add_argument("--extra", default="", help="more server options, space-separated")
    ap.add_argument("--compare", action="store_true",
                    help="also measure a --no-batch server and print the speed-up")
    a = ap.parse_args()
    counts = [int(x) for x in a.clients.split(",")]
    extra = a.extra.split()
    rows = serve(a, counts, extra)
    base = serve(a, counts, extra + ["--no-batch"]) if a.compare else None
    hdr = ("| clients | requests | completion tokens | wall s | aggregate tok/s | tok/s per client |"
           " mean TTFT ms | server CPU s | tok per CPU-s | errors |")
    sep = "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    if base:
        hdr += " --no-batch tok/s | --no-batch tok per CPU-s | CPU efficiency × |"
        sep += "---:|---:|---:|"
    print(hdr)
    print(sep)
    for i, r in enumerate(rows):
        line = "| %d | %d | %d | %.1f | %.2f | %.2f | %.0f | %.1f | %.3f | %d |" % (
            r["clients"], r["requests"], r["tokens"], r["wall_s"], r["agg_tps"],
            r["per_client_tps"], r["ttft_ms"], r["cpu_s"], r["tok_per_cpu_s"], r["errors"])
        if base:
            b = base[i]
            line += " %.2f | %.3f | %.2f |" % (
                b["agg_tps"], b["tok_per_cpu_s"],
                r["tok_per_cpu_s"] / b["tok_per_cpu_s"] if b["tok_per_cpu_s"] else 0.0)
        print(line, flush=True)
    if any(r["errors"] for r in rows + (base or [])):
        sys.exit(1)


if __name__ == "__main__":
    main()
