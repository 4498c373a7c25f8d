#!/usr/bin/python3
"""The upgrade test's judgements over what it recorded, run in the container. Each
subcommand prints one line per finding, "ok <text>" or "not-ok <text>", which
tests/systemd/upgrade.sh turns into the step's details.

  check.py answers LOAD.jsonl RETRY_AFTER_MAX_S SHARE_503_MAX
      every load-client answer: no refused or failed connection, no 5xx but 503 with a
      Retry-After of at most RETRY_AFTER_MAX_S, at most SHARE_503_MAX of the answers 503,
      and nothing but 200/202 otherwise
  check.py spool EXPORT.jsonl MARKERS...
      every acknowledged marker (the load client's 2xx answers, given as LOAD.jsonl files,
      and plain marker lists, one per line) is the payload of an event in the spool export
  check.py delivered EXPORT.jsonl RECEIVED... -- MARKERS...
      every batch in the export is delivered, each batch id arrived exactly once at the
      receivers (counted over every POST they recorded), and every acknowledged marker was
      in a delivered body
  check.py states EXPORT.jsonl
      prints "state=count ..." over the exported batches, and "unfinished=N"
"""
import collections
import json
import sys


def say(ok, text):
    print(("ok " if ok else "not-ok ") + text)


def jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def markers(paths):
    """Acknowledged markers: 2xx answers of load-client files, or lines of marker lists."""
    out = set()
    for p in paths:
        with open(p) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                if line.startswith("{"):
                    r = json.loads(line)
                    if 200 <= r.get("status", 0) < 300:
                        out.add(r["marker"])
                else:
                    out.add(line)
    return out


def answers(path, retry_after_max_s, share_503_max):
    rows = jsonl(path)
    if not rows:
        say(False, "the load client recorded no answer")
        return
    by = collections.Counter(r.get("status", r.get("error")) for r in rows)
    span = max(r["t1"] for r in rows) - min(r["t0"] for r in rows)
    say(True, f"{len(rows)} requests over {span:.1f}s: " + ", ".join(f"{k}: {v}" for k, v in sorted(by.items(), key=str)))
    errors = [r for r in rows if "error" in r]
    refused = [r for r in errors if r["error"] == "ConnectionRefusedError"]
    say(not refused, f"{len(refused)} connections refused")
    say(not errors, f"{len(errors)} requests without an HTTP answer"
        + (f" (first: {errors[0]['error']}: {errors[0]['detail']})" if errors else ""))
    s503 = [r for r in rows if r.get("status") == 503]
    bad503 = [r for r in s503 if not (r.get("retry_after") or "").isdigit()
              or int(r["retry_after"]) > retry_after_max_s]
    other5xx = [r for r in rows if 500 <= r.get("status", 0) < 600 and r["status"] != 503]
    say(not other5xx, f"{len(other5xx)} 5xx other than 503")
    say(not bad503, f"{len(s503)} 503 answers, {len(bad503)} without a Retry-After of at most {retry_after_max_s}s")
    say(len(s503) <= share_503_max * len(rows), f"503 share {len(s503) / len(rows):.3f} (at most {share_503_max})")
    odd = [r for r in rows if "status" in r and r["status"] not in (200, 202, 503)]
    say(not odd, f"{len(odd)} answers other than 200, 202 and 503"
        + (f" (first: {odd[0]['status']})" if odd else ""))
    slowest = max(r["t1"] - r["t0"] for r in rows)
    say(True, f"slowest answer {slowest:.2f}s")


def exported(path):
    recs = jsonl(path)
    batches = {r["id"]: r for r in recs if r.get("record") == "batch"}
    events = [r for r in recs if r.get("record") == "event"]
    return batches, events


def event_marker(e):
    try:
        return json.loads(e.get("payload") or "{}").get("marker")
    except ValueError:
        return None


def spool(export, marker_files):
    want = markers(marker_files)
    batches, events = exported(export)
    have = {event_marker(e) for e in events}
    missing = sorted(want - have)
    say(not missing, f"{len(want)} acknowledged events, {len(want) - len(missing)} in the spool ({len(batches)} batches)"
        + (f"; missing e.g. {missing[:5]}" if missing else ""))


def delivered(export, received, marker_files):
    batches, events = exported(export)
    states = collections.Counter(b["state"] for b in batches.values())
    say(set(states) == {"delivered"}, "batch states: " + ", ".join(f"{k}={v}" for k, v in sorted(states.items())))
    arrivals = collections.Counter()
    bodies = []
    for p in received:
        for r in jsonl(p):
            if "body" not in r:
                continue
            h = {k.lower(): v for k, v in r["headers"].items()}
            arrivals[h.get("x-hookspool-batch")] += 1
            bodies.append(r["body"])
    twice = {b: n for b, n in arrivals.items() if n != 1}
    never = sorted(i for i in batches if str(i) not in arrivals)
    say(not twice and not never,
        f"{len(arrivals)} batch ids arrived, each exactly once" if not twice and not never else
        f"batch ids not delivered exactly once: {dict(list(twice.items())[:5])}, never: {never[:5]}")
    want = markers(marker_files)
    blob = "\n".join(bodies)
    lost = sorted(m for m in want if f'"{m}"' not in blob and f'\\"{m}\\"' not in blob)
    say(not lost, f"{len(want) - len(lost)} of {len(want)} acknowledged events delivered"
        + (f"; not delivered e.g. {lost[:5]}" if lost else ""))


def states(export):
    batches, _ = exported(export)
    c = collections.Counter(b["state"] for b in batches.values())
    unfinished = sum(n for s, n in c.items() if s in ("open", "sealed", "retry", "leased"))
    print(" ".join(f"{k}={v}" for k, v in sorted(c.items())) + f" unfinished={unfinished}")


def main():
    cmd, rest = sys.argv[1], sys.argv[2:]
    if cmd == "answers":
        answers(rest[0], int(rest[1]), float(rest[2]))
    elif cmd == "spool":
        spool(rest[0], rest[1:])
    elif cmd == "delivered":
        sep = rest.index("--")
        delivered(rest[0], rest[1:sep], rest[sep + 1:])
    elif cmd == "states":
        states(rest[0])
    else:
        sys.exit(f"unknown subcommand {cmd}")


if __name__ == "__main__":
    main()
