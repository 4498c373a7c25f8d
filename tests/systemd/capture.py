#!/usr/bin/python3
"""Send a bobbin's GitHub capture file, re-signed with another secret, and print the HTTP
status code (or "ERROR <reason>").

usage: capture.py HOST:PORT URLPATH CAPTURE SECRETFILE [--delivery ID]

CAPTURE is a conformance capture (`# ...` directive lines, the request line, headers, a blank
line, the body; src/bobbins/capture.rs). The body is sent byte for byte (cut to the capture's
Content-Length), with the capture's headers except Host, Content-Length, Connection and the
signature headers; X-Hub-Signature-256 is computed again (GitHub's scheme: "sha256=" and the
hex HMAC-SHA256 of the body) with the key in SECRETFILE, so the test proves the installed
instance verifies with the operator's secret, not the capture's documentation one.
--delivery replaces X-GitHub-Delivery (the source's dedup id) with ID.
"""
import hashlib
import hmac
import socket
import sys

TIMEOUT_S = 20
DROP = {"host", "content-length", "connection", "x-hub-signature", "x-hub-signature-256"}


def parse(path):
    raw = open(path, "rb").read()
    lines = raw.split(b"\n")
    i = 0
    # Directives, comments and blank lines before the request line.
    while i < len(lines) and (lines[i].startswith(b"#") or not lines[i].strip()):
        i += 1
    headers = []
    length = None
    i += 1  # the request line: the test sends to its own path
    while i < len(lines) and lines[i].rstrip(b"\r"):
        name, _, value = lines[i].rstrip(b"\r").decode("latin-1").partition(":")
        value = value.strip()
        if name.lower() == "content-length":
            length = int(value)
        headers.append((name, value))
        i += 1
    body = b"\n".join(lines[i + 1:])
    if length is not None:
        body = body[:length]
    return headers, body


def main():
    where, path, capture, secretfile = sys.argv[1:5]
    rest = sys.argv[5:]
    delivery = rest[rest.index("--delivery") + 1] if "--delivery" in rest else None
    headers, body = parse(capture)
    key = open(secretfile, "rb").read()
    sig = "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()
    h, p = where.rsplit(":", 1)
    head = [f"POST {path} HTTP/1.1", f"Host: {h}", "Connection: close"]
    for name, value in headers:
        if name.lower() in DROP:
            continue
        if delivery and name.lower() == "x-github-delivery":
            value = delivery
        head.append(f"{name}: {value}")
    head += [f"X-Hub-Signature-256: {sig}", f"Content-Length: {len(body)}"]
    s = socket.create_connection((h, int(p)), timeout=TIMEOUT_S)
    s.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
    data = b""
    while b"\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    parts = data.split(b"\r\n", 1)[0].decode("latin-1").split()
    if len(parts) >= 2 and parts[0].startswith("HTTP/"):
        print(parts[1])
    else:
        print("ERROR no HTTP answer")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the test prints whatever went wrong as the step's reason
        print(f"ERROR {type(e).__name__}: {e}")
