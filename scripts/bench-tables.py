#!/usr/bin/env python3
"""bench-tables.py - writes BENCHMARKS.md's current tables, one per area, from bench/results/*.json.

Each results file holds one area's latest figures as the notebook (docs/benchmarks-history.md) states
them, with the date, the machine and the command that measured them; its "kind" names the table below
that lays it out. Ratios are computed here, so a table cannot disagree with its own figures.

    python3 scripts/bench-tables.py            rewrite the tables between BENCHMARKS.md's markers
    python3 scripts/bench-tables.py --check    exit 1 when BENCHMARKS.md differs from what it would write
"""
import argparse
import decimal
import difflib
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
TARGET = os.path.join(ROOT, "BENCHMARKS.md")
HISTORY = os.path.join(ROOT, "docs", "benchmarks-history.md")
BEGIN = "<!-- bench-tables: begin. Written by scripts/bench-tables.py from bench/results/*.json: edit those. -->"
END = "<!-- bench-tables: end -->"


class Bad(Exception):
    """A results file that cannot be laid out: the message names the file and what is wrong."""


# ---- numbers: kept as written (0.40 stays 0.40), ratios computed ----

def num(v, commas=False):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if isinstance(v, int) and commas:
        return f"{v:,}"
    return str(v)


def mw(pair, unit="", commas=False):
    """A [median, worst] pair as "median / worst unit"; a single figure as itself."""
    if pair is None:
        return "-"
    if isinstance(pair, list):
        text = f"{num(pair[0], commas)} / {num(pair[1], commas)}"
    else:
        text = num(pair, commas)
    return f"{text} {unit}".strip()


def times(a, b, digits=2):
    return f"{float(a) / float(b):.{digits}f}x"


def speedup(ours, theirs, higher_is_better):
    """How many times faster ours is (> 1: faster), for one figure or a [median, worst] pair."""
    if ours is None or theirs is None:
        return "-"
    if isinstance(ours, list):
        return ", ".join(speedup(o, t, higher_is_better) for o, t in zip(ours, theirs))
    return times(ours, theirs) if higher_is_better else times(theirs, ours)


def signed(v, digits):
    return f"{v:+.{digits}f}"


def table(headers, rows):
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return lines


# ---- one function per kind of table ----

def starts(d):
    """Fresh starts of one collective: tally beside its peers, median / worst of the starts."""
    peers = d["columns"]  # [key, header] in order; the first is tally, "baseline" the one compared
    base = d["baseline"]
    heads = ["ranks", "size"] + [h for _, h in peers] + [f"tally's speed-up over {d['baseline_name']} (median, worst)"]
    rows = []
    for r in d["rows"]:
        higher = r["unit"] == "GB/s"
        rows.append([r["ranks"], r["size"]] + [mw(r.get(k), r["unit"]) for k, _ in peers] +
                    [speedup(r["tally"], r[base], higher)])
    return table(heads, rows)


def in_place(d):
    heads = ["ranks", "size", "in place: median (worst), us", "slot ring: median (worst), us", "in place's speed-up"]
    rows = [[r["ranks"], r["size"], f"{r['in_place'][0]} ({r['in_place'][1]})",
             f"{r['slot_ring'][0]} ({r['slot_ring'][1]})", speedup(r["in_place"][0], r["slot_ring"][0], False)]
            for r in d["rows"]]
    return table(heads, rows)


def hosts(d):
    heads = ["layout", "link", "flat ring", "hier", "auto (its pick)", "Open MPI", "bound",
             "hier / bound (median, worst)", "hier's speed-up over Open MPI"]
    rows = [[r["layout"], r["link"], mw(r["ring"], "ms"), mw(r["hier"], "ms"),
             f"{mw(r['auto'], 'ms')} ({r['auto_pick']})", mw(r["open_mpi"], "ms"), f"{r['bound']} ms",
             f"{times(r['hier'][0], r['bound'])}, {times(r['hier'][1], r['bound'])}",
             speedup(r["hier"][0], r["open_mpi"][0], False)] for r in d["rows"]]
    return table(heads, rows)


def streams(d):
    heads = ["layout", "link", "1 stream", "2 streams", "4 streams", "bound"]
    rows = [[r["layout"], r["link"]] + [mw(r[k], "ms") for k in ("1", "2", "4")] +
            [f"{r['bound']} ms" if r["bound"] is not None else "-"] for r in d["rows"]]
    return table(heads, rows)


def training(d):
    heads = ["model", "ranks", "tally", "PyTorch", "tally's speed-up", "measured"]
    rows = [[r["model"], r["ranks"], mw(r["tally"], r["unit"], True), f"{mw(r['pytorch'], r['unit'], True)} ({r['pytorch_run']})",
             speedup(r["tally"], r["pytorch"], True), r["measured"]] for r in d["rows"]]
    return table(heads, rows)


def quality(d):
    heads = ["run", "measure", "tally", "PyTorch DDP", "tally - PyTorch", "measured"]
    rows = []
    for r in d["rows"]:
        diff = "-" if r["pytorch"] is None else signed(float(r["tally"]) - float(r["pytorch"]), r["digits"])
        rows.append([r["run"], r["measure"], num(r["tally"]), num(r["pytorch"]), diff, r["measured"]])
    return table(heads, rows)


def python(d):
    heads = ["measurement", "Gloo: median (worst)", "tally: median (worst)", "tally's speed-up (median, worst against worst)"]
    rows = []
    for r in d["rows"]:
        higher = r["better"] == "higher"
        ratio = r.get("instead_of_ratio") or speedup(r["tally"], r["gloo"], higher)
        rows.append([r["measurement"], f"{r['gloo'][0]} ({r['gloo'][1]})", f"{r['tally'][0]} ({r['tally'][1]})", ratio])
    return table(heads, rows)


def torch_ops(d):
    """Each torch.distributed operation, size and world size: latency and busbw over Gloo and over tally."""
    heads = ["operation", "ranks", "size", "Gloo: us, median (worst)", "tally: us, median (worst)",
             "Gloo busbw GB/s", "tally busbw GB/s", "tally's speed-up (median, worst against worst)"]
    rows = []
    for r in d["rows"]:
        g, t = r["gloo"], r["tally"]
        cell = lambda x, k, note: f"{x[k][0]} ({x[k][1]})" if x else note  # noqa: E731
        rows.append([r["op"], r["ranks"], r["size"], cell(g, "us", r.get("gloo_note", "-")),
                     cell(t, "us", r.get("tally_note", "-")), cell(g, "busbw", "-"), cell(t, "busbw", "-"),
                     speedup(t["us"], g["us"], False) if g and t else "-"])
    return table(heads, rows)


def sim_error(d):
    heads = ["set", "points"] + [h for _, h in d["columns"]]
    rows = [[r["set"], r["points"]] + [f"{r[k]}%" if r.get(k) is not None else "" for k, _ in d["columns"]]
            for r in d["rows"]]
    return table(heads, rows)


def published(d):
    heads = ["model"] + [f"{g} GPUs (predicted)" for g in d["gpus"]] + [d["paper_header"]]
    rows = [[r["model"]] + [f"{p}%" for p in r["predicted"]] + [r["paper"]] for r in d["rows"]]
    return table(heads, rows)


def trace(d):
    heads = ["run", "step, trace off: median / worst", "trace on", "on / off (median)", "trace file"]
    rows = [[r["run"], mw(r["off"], "ms"), mw(r["on"], "ms"), times(r["on"][0], r["off"][0]), r["file"]]
            for r in d["rows"]]
    return table(heads, rows)


def compression(d):
    base = next(r for r in d["rows"] if r["codec"] == "none")
    mean = lambda r: sum(float(a) for a in r["accuracy"]) / len(r["accuracy"])
    heads = ["codec", "test accuracy, seeds " + " / ".join(str(s) for s in d["seeds"]), "mean", "vs none (points)",
             "bytes/step/rank", "fewer bytes", "samples/s"]
    rows = [[r["codec"], " / ".join(num(a) for a in r["accuracy"]), f"{mean(r):.4f}",
             "" if r is base else signed(100 * (mean(r) - mean(base)), 2), num(r["bytes"], True),
             times(base["bytes"], r["bytes"]), num(r["samples_per_s"], True)] for r in d["rows"]]
    return table(heads, rows)


def slowlink(d):
    rates = d["rates"]
    base = next(r for r in d["rows"] if r["codec"] == d["baseline"])
    heads = ["codec"] + [f"{d['unit']} at {x}" for x in rates] + ["bytes/step/rank"] + \
            [f"speed-up at {x}" for x in rates]
    rows = []
    for r in d["rows"]:
        figs = [r["at"].get(x) for x in rates]
        ups = [speedup(f, base["at"][x], True) if f is not None else "-" for f, x in zip(figs, rates)]
        rows.append([r["codec"]] + [num(f, True) for f in figs] + [num(r["bytes"], True)] + ups)
    return table(heads, rows)


def local_sgd(d):
    """Runs at each link rate: speed, loss and wall time beside the baseline (sync) measured at that rate."""
    rates = d["rates"]
    base = next(r for r in d["rows"] if r["run"] == d["baseline"])
    heads = ["run", "bytes/step/rank", "fewer bytes"]
    for x in rates:
        heads += [f"{d['unit']} at {x}", f"validation loss at {x} (vs sync)", f"training time at {x} (vs sync)"]
    rows = []
    for r in d["rows"]:
        row = [r["run"], num(r["bytes"], True), times(base["bytes"], r["bytes"], 1)]
        for x in rates:
            got, ref = r["at"].get(x), base["at"].get(x)
            if got is None:
                row += ["-", "-", "-"]
                continue
            loss = num(got["val_loss"])
            if r is not base:
                loss += f" ({signed(100 * (got['val_loss'] - ref['val_loss']) / ref['val_loss'], 1)}%)"
            secs = f"{num(got['seconds'])} s" + ("" if r is base else f" ({times(got['seconds'], ref['seconds'])})")
            row += [num(got["rate"], True), loss, secs]
        rows.append(row)
    return table(heads, rows)


def async_ps(d):
    sync = next(r for r in d["rows"] if r["run"].startswith("sync"))
    heads = ["run", "samples/s", "against sync", "test accuracy", "steps of rank 0", "staleness histogram (0..S)",
             "pulls held back", "step ms (rank 0)"]
    rows = [[r["run"], num(r["samples_per_s"]), times(r["samples_per_s"], sync["samples_per_s"]), num(r["accuracy"]),
             r["steps"], r["histogram"], r["held_back"], num(r["step_ms"])] for r in d["rows"]]
    return table(heads, rows)


def ssp(d):
    """SSP beside sync over seeds: samples/s as [mean, worst] of the seeds' runs, test accuracy per seed;
    the first row is sync's."""
    def mean(xs):
        return sum(float(x) for x in xs) / len(xs)
    sync = d["rows"][0]
    heads = ["run", "samples/s: mean (worst)", "against sync", "test accuracy: mean (each seed)",
             "against sync, points"]
    rows = [[r["run"], f"{num(r['samples_per_s'][0], True)} ({num(r['samples_per_s'][1], True)})",
             times(r["samples_per_s"][0], sync["samples_per_s"][0]),
             f"{mean(r['accuracy']):.4f} ({', '.join(num(a) for a in r['accuracy'])})",
             f"{100 * (mean(r['accuracy']) - mean(sync['accuracy'])):+.2f}"] for r in d["rows"]]
    return table(heads, rows)


def zero(d):
    heads = ["run", "ZeRO stage", "per rank", "against stage 0", "measured"]
    rows = []
    for r in d["rows"]:
        base = next((b for b in d["rows"] if b["run"] == r["run"] and b["stage"] == 0 and b["counts"] == r["counts"]), None)
        ratio = times(r["mb"], base["mb"], 3) if base is not None and base is not r and r["mb"] is not None else ""
        held = f"{num(r['mb'])} MB ({r['counts']})" if r["mb"] is not None else r["counts"]
        rows.append([r["run"], r["stage"], held, ratio, r["measured"]])
    return table(heads, rows)


def plan(d):
    heads = ["prediction", "predicted", "measured", "predicted against measured", "measured on"]
    rows = [[r["what"], f"{r['predicted']} {r['unit']}", ", ".join(f"{m} {r['unit']}" for m in r["measured"]),
             ", ".join(f"{100 * (float(r['predicted']) / float(m) - 1):+.1f}%" for m in r["measured"]), r["when"]]
            for r in d["rows"]]
    return table(heads, rows)


def kill(d):
    heads = ["transport", "survivors", "min", "median", "max", "bound (`TALLY_TIMEOUT` + 1 s)"]
    rows = [[r["transport"], r["survivors"], f"{r['min']} s", f"{r['median']} s", f"{r['max']} s", f"{r['bound']} s"]
            for r in d["rows"]]
    return table(heads, rows)


def fuzz(d):
    heads = ["target", "what it feeds", "inputs run", "exec/s", "crashes", "run on"]
    rows = [[r["target"], r["feeds"], num(r["inputs"], True), num(r["exec_per_s"], True), r["crashes"], r["when"]]
            for r in d["rows"]]
    return table(heads, rows)


def precision(d):
    heads = ["run", "fp32: median (worst)", "bf16: median (worst)", "bf16's speed-up (median, worst against worst)",
             "validation loss fp32, bf16", "measured"]
    rows = [[r["run"], mw(r["fp32"], r["unit"], True), mw(r["bf16"], r["unit"], True), speedup(r["bf16"], r["fp32"], True),
             f"{r['loss'][0]}, {r['loss'][1]} ({signed(100 * (r['loss'][1] - r['loss'][0]) / r['loss'][0], 2)}%)",
             r["measured"]] for r in d["rows"]]
    return table(heads, rows)


def kernels(d):
    heads = ["GB/s", "scalar", "AVX2", "AVX-512"]
    rows = [[r["case"]] + [num(r[k]) for k in ("scalar", "avx2", "avx512")] for r in d["rows"]]
    return table(heads, rows)


KINDS = {f.__name__: f for f in (starts, in_place, hosts, streams, training, quality, python, sim_error, published,
                                  trace, compression, slowlink, async_ps, zero, plan, kill, fuzz, kernels, torch_ops,
                                  precision, local_sgd, ssp)}


# ---- the page ----

def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def history_anchors():
    with open(HISTORY, encoding="utf-8") as f:
        return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", f.read(), re.M)}


def load(name):
    path = os.path.join(RESULTS, name)
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f, parse_float=decimal.Decimal)
    except (OSError, ValueError) as e:
        raise Bad(f"bench/results/{name}: cannot read it as JSON: {e}")
    for key in ("kind", "order", "title", "measured", "machine", "command", "history", "rows"):
        if key not in d:
            raise Bad(f"bench/results/{name}: has no \"{key}\": every results file names it (see another file there)")
    if d["kind"] not in KINDS:
        raise Bad(f"bench/results/{name}: kind \"{d['kind']}\" is not one of {', '.join(sorted(KINDS))}")
    d["_file"] = name
    return d


def section(d, anchors):
    if slug(d["history"]) not in anchors:
        raise Bad(f"bench/results/{d['_file']}: \"history\" names no heading of docs/benchmarks-history.md: "
                  f"{d['history']!r}")
    try:
        body = KINDS[d["kind"]](d)
    except (KeyError, IndexError, TypeError, StopIteration, ZeroDivisionError, decimal.InvalidOperation) as e:
        raise Bad(f"bench/results/{d['_file']}: a row does not fit the \"{d['kind']}\" table "
                  f"({type(e).__name__}: {e}): compare it with the others in the file")
    command = f"`{d['command']}`" if d["command"] else "not named in the notebook"
    out = [f"## {d['title']}", "",
           f"When: {d['measured']}. Machine: {d['machine']}. Command: {command}. "
           f"Figures: [bench/results/{d['_file']}](bench/results/{d['_file']}). The run in the notebook: "
           f"[{d['history']}](docs/benchmarks-history.md#{slug(d['history'])}).", ""]
    if d.get("about"):
        out += [d["about"], ""]
    out += body + [""]
    out += [f"- {n}" for n in d.get("notes", [])]
    if d.get("notes"):
        out.append("")
    return out


def generate():
    # bench/results/*.json, and one folder down (a machine kind's files: bench/results/intel/).
    names = sorted(n for n in os.listdir(RESULTS) if n.endswith(".json"))
    for sub in sorted(os.listdir(RESULTS)):
        if os.path.isdir(os.path.join(RESULTS, sub)):
            names += sorted(f"{sub}/{n}" for n in os.listdir(os.path.join(RESULTS, sub)) if n.endswith(".json"))
    if not names:
        raise Bad("bench/results/ has no .json file: nothing to lay out")
    areas = sorted((load(n) for n in names), key=lambda d: (d["order"], d["_file"]))
    anchors = history_anchors()
    lines = []
    for d in areas:
        lines += section(d, anchors)
    return "\n".join(lines).rstrip("\n") + "\n"


def rewrite(page, tables):
    if page.count(BEGIN) != 1 or page.count(END) != 1 or page.index(BEGIN) > page.index(END):
        raise Bad("BENCHMARKS.md must hold the two marker lines once each, begin before end:\n  " + BEGIN + "\n  " + END)
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + BEGIN + "\n\n" + tables + "\n" + END + tail


def main():
    ap = argparse.ArgumentParser(description="Write BENCHMARKS.md's tables from bench/results/*.json.")
    ap.add_argument("--check", action="store_true", help="exit 1 when BENCHMARKS.md differs from what it would write")
    args = ap.parse_args()
    try:
        with open(TARGET, encoding="utf-8") as f:
            page = f.read()
        new = rewrite(page, generate())
    except (Bad, OSError) as e:
        print(f"bench-tables: {e}", file=sys.stderr)
        return 2
    if args.check:
        if new == page:
            print("bench-tables: BENCHMARKS.md is current")
            return 0
        diff = difflib.unified_diff(page.splitlines(), new.splitlines(), "BENCHMARKS.md", "from bench/results",
                                    lineterm="", n=1)
        print("\n".join(list(diff)[:40]))
        print("bench-tables: BENCHMARKS.md differs from bench/results/*.json: run python3 scripts/bench-tables.py",
              file=sys.stderr)
        return 1
    if new != page:
        with open(TARGET, "w", encoding="utf-8") as f:
            f.write(new)
    print("bench-tables: BENCHMARKS.md written" if new != page else "bench-tables: BENCHMARKS.md was current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
