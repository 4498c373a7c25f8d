#!/usr/bin/env python3
"""One request to hookspool's management API over its Unix socket.

admin.py SOCKET METHOD PATH [BODY]: prints the status code on the first line and the body
after it; an action (POST) carries X-Hookspool-CSRF: 1. Exits 3 with "refused: ..." when
the socket cannot be connected to (e.g. the caller is not in the socket's group).
"""
import socket
import sys

sock, method, path = sys.argv[1:4]
body = sys.argv[4].encode() if len(sys.argv) > 4 else b""
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(30)
try:
    s.connect(sock)
except OSError as e:
    print(f"refused: {e.strerror}")
    sys.exit(3)
head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
if method == "POST":
    head += "X-Hookspool-CSRF: 1\r\nContent-Type: application/json\r\n"
s.sendall(head.encode() + b"\r\n" + body)
data = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
head, _, rest = data.partition(b"\r\n\r\n")
print(head.split(b" ")[1].decode())
print(rest.decode(errors="replace"))
