#!/usr/bin/python3
"""The upgrade test's load client: signed webhooks at a steady rate, one new TCP connection
each (as senders do), until STOPFILE exists. Every answer is one JSON line in OUT, written
before the next request: the marker, the HTTP status and Retry-After, or the error (a refused
connection, a reset, a timeout), with start and end times.

usage: load.py HOST:PORT URLPATH SECRETFILE OUT STOPFILE [--rate PER_S] [--workers N] [--keys N]
       load.py once HOST:PORT URLPATH SECRETFILE KEY MARKER    (one webhook; prints the status)
       load.py watch FILE HOST:PORT URLPATH SECRETFILE [TIMEOUT_S]
           (waits until FILE is replaced, i.e. its inode changes, then sends one webhook at
           once and prints the answer: what a sender meets while a package is unpacked)

Bodies are {"k": "load-k<i>", "marker": "load-<worker>-<seq>"}: the keys spread the events
over a few coalescing groups, the markers let the test find each acknowledged event in the
spool and at the receiver. Signed like the template source's hmac-sha256-hex scheme
(X-Signature: hex HMAC-SHA256 of the body).
"""
import hashlib
import hmac
import json
import os
import socket
import sys
import threading
import time

TIMEOUT_S = 30


def args():
    where, path, secretfile, out, stopfile = sys.argv[1:6]
    opts = {"--rate": 40.0, "--workers": 4, "--keys": 4}
    rest = sys.argv[6:]
    for i in range(0, len(rest), 2):
        opts[rest[i]] = type(opts[rest[i]])(rest[i + 1])
    return where, path, open(secretfile, "rb").read(), out, stopfile, opts


def one(host, port, path, secret, body):
    """Send one webhook; returns (status, retry_after) or raises."""
    sig = hmac.new(secret, body, hashlib.sha256).hexdigest()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Connection: close\r\nX-Signature: {sig}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection((host, port), timeout=TIMEOUT_S) as s:
        s.sendall(head.encode() + body)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    parts = head[0].split()
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise ConnectionError(f"no HTTP answer ({len(data)} bytes)")
    retry_after = None
    for line in head[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "retry-after":
            retry_after = value.strip()
    return int(parts[1]), retry_after


def main():
    where, path, secret, out, stopfile, opts = args()
    host, port = where.rsplit(":", 1)
    port = int(port)
    interval = opts["--workers"] / opts["--rate"]
    lock = threading.Lock()
    f = open(out, "a")

    def worker(w):
        seq = 0
        next_at = time.monotonic()
        while not os.path.exists(stopfile):
            seq += 1
            marker = f"load-{w}-{seq}"
            body = json.dumps({"k": f"load-k{seq % opts['--keys']}", "marker": marker}).encode()
            rec = {"marker": marker, "t0": time.time()}
            try:
                rec["status"], rec["retry_after"] = one(host, port, path, secret, body)
            except Exception as e:  # every failure is recorded; the test judges them
                rec["error"] = type(e).__name__
                rec["detail"] = str(e)
            rec["t1"] = time.time()
            with lock:
                f.write(json.dumps(rec) + "\n")
                f.flush()
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(opts["--workers"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    f.close()


def once():
    where, path, secretfile, key, marker = sys.argv[2:7]
    host, port = where.rsplit(":", 1)
    body = json.dumps({"k": key, "marker": marker}).encode()
    try:
        print(one(host, int(port), path, open(secretfile, "rb").read(), body)[0])
    except Exception as e:
        print(f"ERROR {type(e).__name__}: {e}")


def watch():
    path, where, urlpath, secretfile = sys.argv[2:6]
    timeout_s = float(sys.argv[6]) if len(sys.argv) > 6 else 120.0
    host, port = where.rsplit(":", 1)
    inode = os.stat(path).st_ino
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if os.stat(path).st_ino != inode:
                break
        except FileNotFoundError:
            pass  # between dpkg's rename steps
        time.sleep(0.002)
    else:
        print(f"TIMEOUT {path} was not replaced within {timeout_s:.0f}s")
        return
    body = json.dumps({"k": "watch", "marker": "watch"}).encode()
    try:
        print(one(host, int(port), urlpath, open(secretfile, "rb").read(), body)[0])
    except Exception as e:
        print(f"ERROR {type(e).__name__}: {e}")


if __name__ == "__main__":
    {"once": once, "watch": watch}.get(sys.argv[1], main)()
