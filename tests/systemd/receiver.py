#!/usr/bin/python3
"""The e2e test's delivery receiver: an HTTP server on 127.0.0.1:PORT that appends one JSON
line per POST (path, the X-Hookspool-* headers, the body) to LOG, fsynced before it answers.

A body containing "SLOW-" is held for HOLD_S seconds (8, or RECEIVER_HOLD_S) the first time
it arrives (the e2e test kills the dispatcher during that time, the upgrade test stops it)
and answered at once when it comes again. When a held request has been answered, a line
{"held_answered": true, ...} with the time follows.

usage: receiver.py PORT LOG
"""
import http.server
import json
import os
import sys
import threading
import time

HOLD_S = float(os.environ.get("RECEIVER_HOLD_S", "8"))
seen = set()
lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(n).decode("utf-8", "replace")
        rec = {
            "path": self.path,
            "headers": {k: v for k, v in self.headers.items() if k.lower().startswith("x-hookspool")},
            "body": body,
            "t": time.time(),
        }
        hold = False
        with lock:
            with open(LOG, "a") as f:
                f.write(json.dumps(rec) + "\n")
                f.flush()
                os.fsync(f.fileno())
            for marker in [w for w in body.replace('"', " ").split() if w.startswith("SLOW-")]:
                if marker not in seen:
                    seen.add(marker)
                    hold = True
        if hold:
            time.sleep(HOLD_S)
        out = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
        if hold:
            self.wfile.flush()
            done = {"held_answered": True, "headers": rec["headers"], "t": time.time()}
            with lock:
                with open(LOG, "a") as f:
                    f.write(json.dumps(done) + "\n")
                    f.flush()
                    os.fsync(f.fileno())

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    PORT, LOG = int(sys.argv[1]), sys.argv[2]
    http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
