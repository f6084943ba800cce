#!/usr/bin/env python3
"""torch_ops.py - every torch.distributed operation over tally beside the same over Gloo, in one run: for
each world size, each backend started afresh STARTS times (alternating), bench/torch_ops_bench.py timing
every operation at each size; prints median and worst of the starts and tally's speed-up, and with --write
stores them as bench/results/torch-ops.json, or the results file named (BENCHMARKS.md's table:
scripts/bench-tables.py).
usage: bench/torch_ops.py [--starts 3] [--ranks 2,4] [--sizes 1024,1048576,67108864] [--write [PATH]]
(needs the build with the backend, PYTHONPATH=build/python: scripts/deps.sh --torch; Debian's python3)"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_OUT = os.path.join(HERE, "results", "torch-ops.json")
SIZE_NAMES = {1024: "1 KiB", 1 << 20: "1 MiB", 64 << 20: "64 MiB"}


def one_start(backend, ranks, sizes):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "build", "python"))
    cmd = ["/usr/bin/python3", os.path.join(HERE, "torch_ops_bench.py"), backend, str(ranks),
           ",".join(str(s) for s in sizes)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode:
        sys.stderr.write(f"torch_ops: {backend} on {ranks} ranks failed (exit {p.returncode}):\n{p.stderr[-3000:]}\n")
    return rows


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def summarize(samples):
    """{(op, ranks, bytes, backend): [rows]} -> table rows with [median, worst] of us and busbw."""
    out = []
    keys = sorted({(op, r, b) for (op, r, b, _) in samples}, key=lambda k: (k[1], list(FIELDS_ORDER).index(k[0]), k[2]))
    for op, r, b in keys:
        row = {"op": op, "ranks": r, "size": SIZE_NAMES.get(b, f"{b} B")}
        for backend in ("gloo", "tally"):
            got = samples.get((op, r, b, backend), [])
            if any("error" in g for g in got) or not got:
                row[backend] = None
                row[backend + "_note"] = next((g["error"] for g in got if "error" in g), "not run")
                continue
            us = [g["us"] for g in got]
            bw = [g["busbw"] for g in got]
            row[backend] = {"us": [round(statistics.median(us), 1), round(max(us), 1)],
                            "busbw": [round(statistics.median(bw), 3), round(min(bw), 3)]}
        out.append(row)
    return out


FIELDS_ORDER = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all_single", "broadcast", "reduce", "gather",
                "scatter", "send_recv")


def ratio(row):
    g, t = row.get("gloo"), row.get("tally")
    if not g or not t:
        return "-"
    return f"{g['us'][0] / t['us'][0]:.1f}x (worst {g['us'][1] / t['us'][1]:.1f}x)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--sizes", default="1024,1048576,67108864")
    ap.add_argument("--write", nargs="?", const=DEFAULT_OUT, default=None,
                    metavar="PATH", help="store the results (default bench/results/torch-ops.json)")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    samples = {}
    for ranks in [int(r) for r in a.ranks.split(",")]:
        for start in range(a.starts):
            for backend in ("gloo", "tally"):
                for row in one_start(backend, ranks, sizes):
                    samples.setdefault((row["op"], ranks, row["bytes"], backend), []).append(row)
                print(f"torch_ops: {ranks} ranks, start {start + 1}/{a.starts}, {backend} done", file=sys.stderr,
                      flush=True)
    rows = summarize(samples)
    print(f"{'op':18} {'ranks':>5} {'size':>7} {'gloo us':>16} {'tally us':>16} {'gloo/tally':>22}")
    for r in rows:
        g = f"{r['gloo']['us'][0]} ({r['gloo']['us'][1]})" if r.get("gloo") else "-"
        t = f"{r['tally']['us'][0]} ({r['tally']['us'][1]})" if r.get("tally") else "-"
        print(f"{r['op']:18} {r['ranks']:>5} {r['size']:>7} {g:>16} {t:>16} {ratio(r):>22}")
    if a.write:
        doc = {
            "kind": "torch_ops",
            "order": 91,
            "title": "Every torch.distributed operation: tally beside Gloo",
            "measured": datetime.date.today().isoformat(),
            "machine": f"{os.cpu_count()} cores, {cpu_name()}, Debian's PyTorch 1.13.1, ranks unpinned",
            "command": f"bench/torch_ops.py --starts {a.starts} --ranks {a.ranks} --sizes {a.sizes} --write"
                       + ("" if os.path.abspath(a.write) == DEFAULT_OUT else f" {os.path.relpath(a.write, ROOT)}"),
            "history": "Every torch.distributed operation: tally beside Gloo",
            "about": ("bench/torch_ops_bench.py, one fresh start per backend in turn, STARTS times: each operation "
                      "timed the nccl-tests way (a warm-up, then 40, 10 or 3 calls by size; the slowest rank's "
                      "time), median and worst of the starts. send_recv: half a ping-pong round trip between "
                      "ranks 0 and 1. busbw with nccl-tests' factors."),
            "rows": rows,
        }
        path = a.write
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        print(f"torch_ops: wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
