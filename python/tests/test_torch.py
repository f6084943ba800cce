"""test_torch.py - PyTorch's "tally" backend: torch_ranks.py's cases under `tally run` and torchrun, DDP's
parameters against Gloo's, a dead rank, a mismatch. usage: test_torch.py TALLY_BIN (PYTHONPATH has the
package). Exits 77 (skipped) when PyTorch or the backend is not there."""
import os
import re
import subprocess
import sys
import tempfile

from tiers import wants

here = os.path.dirname(os.path.abspath(__file__))
# A rank's verdict, after whatever prefix its launcher puts on the line ("[1] ", "[default1]:").
RESULT = re.compile(r"result (\S+) (\d+) (\d+) ?(.*)$")
worker = os.path.join(here, "torch_ranks.py")


def launch(cmd, case, n, label):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        out = p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        return [f"{label}: did not end within 300 s"], 0, ""
    fails, passed, seen = [], 0, set()
    for line in out.splitlines():
        m = RESULT.search(line)
        if m:
            seen.add(m.group(1))
            passed += int(m.group(2))
            if int(m.group(3)):
                fails.append(f"{label} rank {m.group(1)}: {m.group(4)}")
    want = n - 1 if case == "death" else n
    if len(seen) < want:
        fails.append(f"{label}: {want - len(seen)} ranks gave no verdict; output:\n{out[-3000:]}")
    return fails, passed, out


def tally_run(tally_bin, n, *args):
    return [tally_bin, "run", "-n", str(n), "--timeout", "20", sys.executable, worker, *args]


def main():
    try:
        import torch
        import tally.torch  # noqa: F401
    except ImportError as e:
        print(f"test_torch: SKIPPED: {e}")
        sys.exit(77)
    tally_bin = sys.argv[1]
    fails, passed = [], 0

    def note(f, p, label):
        nonlocal fails, passed
        fails += f
        passed += p
        print(f"  {label}: {'ok' if not f else 'FAILED'} ({p} checks)", flush=True)

    # The quick tier: every collective through the backend once, on 2 ranks; the rest is the external tier's.
    if wants("quick"):
        f, p, _ = launch(tally_run(tally_bin, 2, "collectives"), "collectives", 2, "collectives, tally run -n 2")
        note(f, p, "collectives, tally run -n 2")
        f, p, _ = launch(tally_run(tally_bin, 2, "more"), "more", 2, "more operations, tally run -n 2")
        note(f, p, "more operations, tally run -n 2")
    if not wants("external"):
        finish(fails, passed)
    f, p, _ = launch(tally_run(tally_bin, 3, "collectives"), "collectives", 3, "collectives, tally run -n 3")
    note(f, p, "collectives, tally run -n 3")
    for n in (3, 4):
        f, p, _ = launch(tally_run(tally_bin, n, "more"), "more", n, f"more operations, tally run -n {n}")
        note(f, p, f"more operations, tally run -n {n}")
    # --redirects 1 --tee 1: Debian's torchrun 1.13 under Python 3.11 cannot parse its own defaults (0) for
    # them (the enum no longer lists a zero flag), and fails before it starts a worker.
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                "--redirects", "1", "--tee", "1", worker, "collectives"]
    f, p, _ = launch(torchrun, "collectives", 2, "collectives, torchrun --nproc_per_node 2")
    note(f, p, "collectives, torchrun --nproc_per_node 2")

    with tempfile.TemporaryDirectory() as tmp:
        for n in (2, 3):
            params = {}
            for backend in ("gloo", "tally"):
                path = os.path.join(tmp, f"{backend}{n}.pt")
                f, p, _ = launch(tally_run(tally_bin, n, "ddp", backend, path), "ddp", n, f"DDP {backend} n={n}")
                note(f, p, f"DDP on the MLP, backend {backend}, {n} ranks")
                if not f:
                    params[backend] = torch.load(path)
            if len(params) == 2:
                a, b = params["gloo"], params["tally"]
                rel = ((a - b).norm() / a.norm()).item()
                worst = ((a - b).abs().max() / a.abs().max()).item()
                ok = rel <= 1e-6 and worst <= 1e-6
                print(f"  DDP {n} ranks, tally against gloo: |a-b|/|a| = {rel:.2e}, max|a-b|/max|a| = {worst:.2e}"
                      f"{' (bit-identical)' if torch.equal(a, b) else ''}")
                note([] if ok else [f"DDP {n} ranks: parameters differ from gloo's by {rel:.2e} ({worst:.2e})"],
                     1, f"DDP {n} ranks: tally's parameters = gloo's to 1e-6")

    f, p, out = launch(tally_run(tally_bin, 3, "death"), "death", 3, "death")
    note(f, p, "rank 2 dies, 3 ranks")
    print("\n".join("    " + line for line in out.splitlines() if " got: " in line))
    f, p, _ = launch(tally_run(tally_bin, 3, "mismatch"), "mismatch", 3, "mismatch")
    note(f, p, "counts 7 and 8, 3 ranks")
    finish(fails, passed)


def finish(fails, passed):
    for f in fails:
        print("FAIL", f)
    print(f"test_torch: {passed} passed, {len(fails)} failed")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
