#!/usr/bin/python3
"""The exec processor of the e2e test's private bobbin (spec 14.3.4, src/processor/exec.rs):
one JSON document on stdin ({batch, instance, bobbin, settings, state}), one on stdout
({items, state}). Each event becomes one "widget" item carrying the event's marker, the
instance's running count (kept in state, so a second batch shows the first one's count) and
what this process could reach: the sandbox must keep it away from the spool, the config and
the secrets, and from the network. It also reports who ran it (its uid, its cgroup, its
parent's command line), so the test can tell it ran as the dispatcher's user, inside the
dispatch unit, started by `hookspool processor <instance>`."""
import json
import os
import socket
import sys


def can_read(path):
    try:
        with open(path, "rb") as f:
            f.read(1)
        return True
    except OSError:
        return False


def can_connect():
    try:
        socket.create_connection(("127.0.0.1", 8650), timeout=2).close()
        return True
    except OSError:
        return False


def text_of(path):
    try:
        with open(path, "rb") as f:
            return f.read(4096).decode("utf-8", "replace").strip()
    except OSError as e:
        return "unreadable: %s" % e.strerror


def parent_argv():
    try:
        with open("/proc/%d/cmdline" % os.getppid(), "rb") as f:
            return [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError as e:
        return ["unreadable: %s" % e.strerror]


doc = json.load(sys.stdin)
count = int(doc["state"].get("count", 0))
reach = {
    "spool_db": can_read("/var/lib/hookspool/spool.db"),
    "config": can_read("/etc/hookspool/config.toml"),
    "secret": can_read("/etc/hookspool/secrets/demo"),
    "network": can_connect(),
}
who = {"uid": os.getuid(), "cgroup": text_of("/proc/self/cgroup"), "parent": parent_argv()}
items = []
for ev in doc["batch"]["events"]:
    count += 1
    items.append({
        "event_type": "widget",
        "marker": ev.get("marker"),
        "count": count,
        "label": doc["settings"]["label"],
        "instance": doc["instance"],
        "bobbin": os.environ.get("HOOKSPOOL_BOBBIN"),
        "source_batch": doc["batch"]["batch_id"],
        "reach": reach,
        "who": who,
    })
# Ids and counts only on stderr (it becomes the attempt's detail).
print("acme.widgets: batch %s, %d item(s)" % (doc["batch"]["batch_id"], len(items)), file=sys.stderr)
json.dump({"items": items, "state": {"count": count}}, sys.stdout)
