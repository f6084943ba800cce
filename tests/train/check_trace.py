#!/usr/bin/env python3
"""check_trace.py - checks a timeline tally train --trace wrote: Chrome trace JSON with a track per rank and per
communication thread, clocks lined up, and each step's gradient allreduces overlapping backward (overlap) or
all after it (no-overlap). usage: check_trace.py FILE RANKS overlap|no-overlap; prints what it found, exits 1
on the first failed check."""
import json
import statistics
import sys

path, ranks, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
doc = json.load(open(path))


def fail(msg):
    print("FAIL " + msg)
    sys.exit(1)


ev = [e for e in doc["traceEvents"] if e]
meta = doc.get("otherData", {})
if len(meta.get("clock_offset_us", [])) != ranks:
    fail(f"otherData.clock_offset_us has not {ranks} entries: {meta}")
spans = [e for e in ev if e.get("ph") == "X"]
pids = sorted({e["pid"] for e in spans})
if pids != list(range(ranks)):
    fail(f"spans from ranks {pids}, want 0..{ranks - 1}")
threads = {(e["pid"], e["args"]["name"]) for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"}
for r in range(ranks):
    for want in ("main", "comm thread"):
        if (r, want) not in threads and not (want.startswith("comm") and mode == "no-overlap"):
            fail(f"rank {r} has no '{want}' track: {sorted(threads)}")
for e in spans:
    if e["dur"] < 0 or not isinstance(e["ts"], (int, float)):
        fail(f"bad span {e}")
cats = {e["cat"] for e in spans}
for want in ("train", "forward", "backward", "coll"):
    if want not in cats:
        fail(f"no '{want}' spans (categories: {sorted(cats)})")
names = {e["name"] for e in spans if e["cat"] == "train"}
for want in ("step", "data", "optimizer", "wait for gradients"):
    if want not in names:
        fail(f"no '{want}' span (train spans: {sorted(names)})")

# Clocks: the same collective ends on every rank at about the same moment once the offsets are applied.
ends = {}
for e in spans:
    if e["cat"] == "coll":
        ends.setdefault(e["args"]["seq"], {})[e["pid"]] = e["ts"] + e["dur"]
gaps = [max(v.values()) - min(v.values()) for v in ends.values() if len(v) == ranks]
if not gaps or statistics.median(gaps) > 5000:
    fail(f"the ranks' copies of one collective end {statistics.median(gaps) if gaps else '?'} us apart (median)")
print(f"{len(spans)} spans, {len(gaps)} collectives on every rank, ends {statistics.median(gaps):.1f} us apart (median)")

# Per step of each rank: when each gradient bucket was ready to leave (handed to the communication thread)
# and when its allreduce ran, against the end of backward.
posted_early = posted_after = ran_early = steps = late_runs = 0
for r in range(ranks):
    mine = [e for e in spans if e["pid"] == r]
    for s in (e for e in mine if e["name"] == "step" and e["cat"] == "train"):
        lo, hi = s["ts"], s["ts"] + s["dur"]
        within = [e for e in mine if lo <= e["ts"] <= hi]
        back = [e for e in within if e["cat"] == "backward"]
        ready = [e for e in within if e["name"] == "bucket ready"]
        runs = [e for e in within if e["cat"] == "coll" and e["name"] == "allreduce" and e["args"]["bytes"] > 64]
        if not back or len(ready) < 2 or not runs:
            continue
        steps += 1
        back_end = max(e["ts"] + e["dur"] for e in back)
        first_ready = min(e["ts"] for e in ready)
        posted_early += first_ready < back_end
        posted_after += first_ready >= back_end
        ran_early += min(e["ts"] for e in runs) < back_end
        late_runs += min(e["ts"] for e in runs) < first_ready - 1  # an allreduce before its bucket was ready
print(f"{steps} steps with 2+ buckets: the first bucket ready before backward ended in {posted_early}, after it in "
      f"{posted_after}; an allreduce running while backward ran in {ran_early}")
if steps < 10:
    fail("fewer than 10 steps with backward and 2+ buckets")
if late_runs:
    fail(f"{late_runs} steps ran an allreduce before its bucket was ready")
if mode == "overlap" and (posted_early != steps or ran_early == 0):
    fail("with overlap on, the first bucket should leave while backward runs, and some allreduce run then")
if mode == "no-overlap" and (posted_after != steps or ran_early):
    fail("with --no-overlap, every bucket should leave and run after backward")
print("OK")
