"""compare - tally's results beside Gloo's: the gaps (passing on Gloo, failing on tally) grouped by tally's
error, the tests PyTorch skips on tally because it names Gloo, the counts; and the allow-list of gaps.

A test skipped on tally that passes on Gloo is restricted by name when its skip reason names a backend
(Gloo, or tally's name, which PyTorch's messages put in for a backend outside a DistTestCases set) or when
its decorators in distributed_test.py test BACKEND; any other such skip is a gap like a failure."""
import fnmatch
import re

BAD = ("fail", "error", "timeout")
NAMES_BACKEND = re.compile(r"gloo|\btally\b|requires backend", re.I)


def read_allow(path):
    """NAME-or-glob: reason, one a line; '#' starts a comment. An entry without a reason is refused."""
    allow = {}
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            name, _, reason = line.partition(":")
            if not reason.strip():
                raise ValueError(f"{path}:{n}: '{line}' gives no reason: write 'test_name: why tally may fail it'")
            allow[name.strip()] = reason.strip()
    return allow


def allowed(allow, name):
    for pattern, reason in allow.items():
        if fnmatch.fnmatchcase(name, pattern):
            return reason
    return None


def guards(source_path):
    """Each test's decorators in distributed_test.py (its skip conditions), by the test's name."""
    found, pending, depth = {}, [], 0
    try:
        with open(source_path) as f:
            lines = f.read().splitlines()
    except (OSError, TypeError):
        return found
    for line in lines:
        s = line.strip()
        if depth > 0:  # inside a decorator's parentheses
            pending.append(s)
            depth += s.count("(") - s.count(")")
            continue
        m = re.match(r"def (test_\w+)\(", s)
        if m:
            found[m.group(1)], pending = "\n".join(pending), []
        elif s.startswith("@"):
            pending.append(s)
            depth = s.count("(") - s.count(")")
        elif s and not s.startswith("#"):
            pending = []
    return found


def base_name(name, known):
    """A parametrized test's name in the source: test_x_static_graph_True comes from def test_x."""
    while name not in known and "_" in name:
        name = name.rsplit("_", 1)[0]
    return name


def by_name(name, reason, guard_text):
    return bool(NAMES_BACKEND.search(reason or "")) or bool(re.search(r"BACKEND|gloo", guard_text or ""))


def classify(gloo, tally, allow, source_guards):
    """Per test, for one world size: 'gap', 'allowed', 'named' (skipped on tally by name), 'tally_only'
    (passes on tally, not on Gloo), 'both_bad', 'notrun' (a limit stopped either run), or None."""
    rows = []
    for name in sorted(set(gloo) | set(tally)):
        g, t = gloo.get(name, {}), tally.get(name, {})
        gs, ts = g.get("status", "absent"), t.get("status", "absent")
        kind, note = None, ""
        if "notrun" in (gs, ts) or "absent" in (gs, ts):
            kind = "notrun"
        elif gs == "pass" and ts in BAD:
            kind, note = "gap", t.get("error", "")
        elif gs == "pass" and ts == "skip":
            guard = source_guards.get(base_name(name, source_guards), "")
            if by_name(name, t.get("reason"), guard):
                kind, note = "named", t.get("reason", "")
            else:
                kind, note = "gap", "skipped on tally only: " + (t.get("reason") or "")
        elif ts == "pass" and gs != "pass":
            kind, note = "tally_only", f"gloo: {gs} {g.get('error') or g.get('reason') or ''}".strip()
        elif gs in BAD and ts in BAD:
            kind, note = "both_bad", g.get("error", "")
        if kind == "gap":
            why = allowed(allow, name)
            if why:
                kind, note = "allowed", f"{note}  [allowed: {why}]"
        if kind:
            rows.append((name, kind, note))
    return rows


def normalize(error):
    """Groups like errors: numbers, addresses and paths do not split a group."""
    e = re.sub(r"0x[0-9a-f]+", "ADDR", error or "(no message)")
    e = re.sub(r"(/[\w.\-]+)+", "PATH", e)
    return re.sub(r"\d+", "N", e)


def counts(results):
    c = {}
    for rec in results.values():
        c[rec["status"]] = c.get(rec["status"], 0) + 1
    return c


def report(pairs, allow, source_guards, out):
    """pairs: {world_size: (gloo_results, tally_results)}. Prints the table; returns the number of gaps that
    the allow-list does not cover plus the tests a limit left unrun (either makes the comparison fail)."""
    by_kind = {}
    for ws, (gloo, tally) in sorted(pairs.items()):
        for name, kind, note in classify(gloo["tests"], tally["tests"], allow, source_guards):
            by_kind.setdefault(kind, {}).setdefault(name, {})[ws] = note
    _print_gaps(by_kind.get("gap", {}), "GAPS: pass on gloo, fail on tally", out)
    _print_gaps(by_kind.get("allowed", {}), "ALLOWED gaps (allow-list)", out)
    _print_list(by_kind.get("named", {}), "SKIPPED on tally because PyTorch names the backend", out)
    _print_list(by_kind.get("both_bad", {}), "FAIL on both (look at gloo: this machine or a flaky test)", out)
    _print_list(by_kind.get("tally_only", {}), "PASS on tally only", out)
    _print_list(by_kind.get("notrun", {}), "NOT RUN (a limit stopped a run, or a test is missing from one)", out)
    _print_counts(pairs, by_kind, out)
    return len(by_kind.get("gap", {})) + len(by_kind.get("notrun", {}))


def _sizes(per_ws):
    return "x" + ",".join(str(ws) for ws in sorted(per_ws))


def _print_gaps(gaps, title, out):
    print(f"\n== {title}: {len(gaps)} ==", file=out)
    groups = {}
    for name, per_ws in gaps.items():
        for ws, note in per_ws.items():
            groups.setdefault(normalize(note.split("  [allowed:")[0]), {}).setdefault(name, (note, set()))[1].add(ws)
    for key, members in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        example = next(iter(members.values()))[0]
        print(f"[{len(members)}] {example}", file=out)
        for name, (_, sizes) in sorted(members.items()):
            print(f"      {name} ({_sizes(sizes)})", file=out)


def _print_list(items, title, out):
    print(f"\n== {title}: {len(items)} ==", file=out)
    for name, per_ws in sorted(items.items()):
        notes = sorted(set(per_ws.values()))
        print(f"  {name} ({_sizes(per_ws)}): {' | '.join(n for n in notes if n)}", file=out)


def _print_counts(pairs, by_kind, out):
    print("\n== counts ==", file=out)
    head = ("ranks", "tests", "gloo pass", "tally pass", "gaps", "allowed", "named", "tally only", "both bad",
            "not run", "gloo s", "tally s")
    print("  ".join(f"{h:>10}" for h in head), file=out)
    for ws, (gloo, tally) in sorted(pairs.items()):
        def n(kind):
            return sum(1 for per_ws in by_kind.get(kind, {}).values() if ws in per_ws)
        row = (ws, len(set(gloo["tests"]) | set(tally["tests"])), counts(gloo["tests"]).get("pass", 0),
               counts(tally["tests"]).get("pass", 0), n("gap"), n("allowed"), n("named"), n("tally_only"),
               n("both_bad"), n("notrun"), gloo.get("seconds", ""), tally.get("seconds", ""))
        print("  ".join(f"{v:>10}" for v in row), file=out)
