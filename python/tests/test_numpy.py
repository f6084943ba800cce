"""test_numpy.py - the tally package from NumPy: runs numpy_ranks.py under `tally run` for each case and
world size, and checks every rank's verdict. usage: test_numpy.py TALLY_BIN (PYTHONPATH has the package)."""
import os
import re
import subprocess
import sys

from tiers import wants

here = os.path.dirname(os.path.abspath(__file__))
# A rank's verdict, after whatever prefix its launcher puts on the line ("[1] ", "[default1]:").
RESULT = re.compile(r"result (\S+) (\d+) (\d+) ?(.*)$")


def run(tally_bin, n, case, transport=None):
    cmd = [tally_bin, "run", "-n", str(n)]
    if transport:
        cmd += ["--transport", transport]
    cmd += ["--timeout", "20", sys.executable, os.path.join(here, "numpy_ranks.py"), case]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        out = p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        return [f"{case} n={n}: did not end within 300 s"], 0
    fails, passed, seen = [], 0, set()
    for line in out.splitlines():
        m = RESULT.search(line)
        if m:
            seen.add(int(m.group(1)))
            passed += int(m.group(2))
            if int(m.group(3)):
                fails.append(f"{case} n={n} {transport or ''} rank {m.group(1)}: {m.group(4)}")
    want = set(range(n)) if case not in ("death",) else set(range(n - 1))
    if not want <= seen:
        fails.append(f"{case} n={n} {transport or ''}: ranks {sorted(want - seen)} gave no verdict; output:\n"
                     + out[-3000:])
    if case == "death":
        print("\n".join(l for l in out.splitlines() if " got: " in l))
    return fails, passed


def main():
    try:
        import numpy  # noqa: F401
    except ImportError:
        print("test_numpy: SKIPPED: NumPy is not installed for this Python (Debian's python3-numpy; "
              "scripts/deps.sh installs it)")
        sys.exit(77)
    tally_bin = sys.argv[1]
    fails, passed = [], 0
    # The quick tier: every collective on 2 ranks, the argument checks, a mismatch, the lifetimes; the long
    # one the rest.
    for n, case, tp, tier in [(1, "collectives", None, "long"), (2, "collectives", None, "quick"),
                              (3, "collectives", None, "long"), (2, "collectives", "tcp", "long"),
                              (2, "checks", None, "quick"), (2, "more", None, "quick"), (3, "more", None, "long"),
                              (4, "more", "tcp", "long"), (3, "death", None, "long"), (3, "mismatch", None, "quick"),
                              (2, "config", None, "quick"), (3, "config", None, "long"), (2, "logfree", None, "quick"),
                              (2, "lifetime", None, "quick"), (2, "lifetime", "tcp", "long")]:
        if not wants(tier):
            continue
        f, p = run(tally_bin, n, case, tp)
        fails += f
        passed += p
        print(f"  {case} on {n} ranks{' over ' + tp if tp else ''}: {'ok' if not f else 'FAILED'} ({p} checks)",
              flush=True)
    for f in fails:
        print("FAIL", f)
    print(f"test_numpy: {passed} passed, {len(fails)} failed")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
