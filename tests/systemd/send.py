#!/usr/bin/python3
"""Send one webhook and print the HTTP status line's code (or "ERROR <reason>").

usage: send.py (tcp HOST:PORT | unix PATH | tls HOST:PORT) URLPATH BODYFILE [--chunked]
               [-H 'Name: value']...

With --chunked the body goes out as Transfer-Encoding: chunked in two chunks and without a
Content-Length (what some senders do; the reverse proxy must de-chunk it).
"""
import socket
import ssl
import sys

TIMEOUT_S = 20


def main():
    kind, where, path, bodyfile = sys.argv[1:5]
    rest = sys.argv[5:]
    chunked = "--chunked" in rest
    headers = []
    i = 0
    while i < len(rest):
        if rest[i] == "-H":
            headers.append(rest[i + 1])
            i += 2
        else:
            i += 1
    body = open(bodyfile, "rb").read()
    if kind == "unix":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(TIMEOUT_S)
        s.connect(where)
        host = "localhost"
    else:
        h, p = where.rsplit(":", 1)
        s = socket.create_connection((h, int(p)), timeout=TIMEOUT_S)
        host = h
        if kind == "tls":
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            s = ctx.wrap_socket(s, server_hostname="hooks.test")
    head = [f"POST {path} HTTP/1.1", f"Host: {host}", "Content-Type: application/json", "Connection: close"]
    head += headers
    if chunked:
        head.append("Transfer-Encoding: chunked")
        half = len(body) // 2
        payload = b""
        for part in (body[:half], body[half:]):
            payload += b"%x\r\n" % len(part) + part + b"\r\n"
        payload += b"0\r\n\r\n"
    else:
        head.append(f"Content-Length: {len(body)}")
        payload = body
    s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
    data = b""
    while b"\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    line = data.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split()
    if len(parts) >= 2 and parts[0].startswith("HTTP/"):
        print(parts[1])
    else:
        print("ERROR no HTTP answer" + (f": {line!r}" if line else ""))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the test prints whatever went wrong as the step's reason
        print(f"ERROR {type(e).__name__}: {e}")
