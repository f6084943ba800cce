"""torch_suite.py - PyTorch 1.13's own distributed tests (DistributedTest._DistTestBase, as PyTorch's
test/distributed/test_distributed_spawn.py runs them, on CPU) against the "tally" backend, beside Gloo.

  torch_suite.py run -b tally -n 2 [-k PATTERN]...        one backend, one world size: a JSON result per test
  torch_suite.py compare [-n 2,3,4] [-k PATTERN]...       gloo and tally, then the gaps, the by-name skips, counts
  torch_suite.py check                                    exit 77 (and say why) where torch or tally.torch is missing

docs/python.md ("PyTorch's own distributed tests") says how to read the results and the allow-list."""
import argparse
import fnmatch
import json
import os
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare  # noqa: E402
import runner  # noqa: E402

SOURCE = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
# What tally's backend stands for, which PyTorch keys on these sets' names (docs/python.md says why).
DEFAULT_FEATURES = "ddp,subgroup,plugin"
SKIPPED = 77


def parse(argv):
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-k", dest="patterns", action="append", default=[],
                        help="run the tests whose name matches (a substring or a glob, as unittest -k); repeatable")
    common.add_argument("--tests", metavar="FILE",
                        help="run only the tests named in FILE, one a line ('#' starts a comment); -k narrows further")
    common.add_argument("--build", default=os.environ.get("TALLY_BUILD_DIR", os.path.join(SOURCE, "build")),
                        help="the tally build whose python/ holds the package and its backend (default: ./build)")
    common.add_argument("--python", default=os.environ.get("TALLY_PYTHON", "/usr/bin/python3"),
                        help="the interpreter with torch (default: Debian's /usr/bin/python3)")
    common.add_argument("--test-limit", type=int, default=300, metavar="S",
                        help="seconds one test may take before its ranks are killed (default 300, PyTorch's own)")
    common.add_argument("--run-limit", type=int, default=4 * 3600, metavar="S",
                        help="seconds one backend at one world size may take; tests left are 'notrun' (default 14400)")
    common.add_argument("--features", default=DEFAULT_FEATURES,
                        help="DistTestCases.backend_feature sets tally is added to, comma-separated, or 'none' "
                        f"for PyTorch's sets as shipped (default {DEFAULT_FEATURES})")
    common.add_argument("--init-method", choices=("file", "env"), default="file",
                        help="INIT_METHOD as PyTorch's run_test.py sets it (file runs the barrier-timeout tests)")
    common.add_argument("--no-py311-fix", dest="py311_fix", action="store_false",
                        help="PyTorch 1.13 as installed: under Python 3.11 no DDP test passes then (torch_py311.py)")
    common.add_argument("--keep-logs", action="store_true", help="keep the logs of passing tests too")
    common.add_argument("-q", "--quiet", dest="verbose", action="store_false", help="no line per test")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", parents=[common], help="one backend at one world size")
    r.add_argument("-b", "--backend", default="tally")
    r.add_argument("-n", "--world-size", type=int, default=2)
    r.add_argument("-o", "--out", help="the JSON file (default: BUILD/torch_suite/BACKEND-N.json)")
    c = sub.add_parser("compare", parents=[common], help="gloo and tally at each world size, then the table")
    c.add_argument("-n", "--world-sizes", default="2,3,4", help="comma-separated (default 2,3,4)")
    c.add_argument("-o", "--out-dir", help="where gloo-N.json and tally-N.json go (default: BUILD/torch_suite)")
    c.add_argument("--allow", default=os.path.join(HERE, "allow.txt"),
                   help="the allow-list: gaps tolerated, each with its reason (default: allow.txt beside this)")
    c.add_argument("--reuse", action="store_true",
                   help="take a backend's results from its JSON when made with the same options, with none unrun")
    c.add_argument("--table-only", action="store_true", help="run nothing: the table from the JSON files there")
    sub.add_parser("check", parents=[common], help="exit 77 where the suite cannot run here")
    opts = p.parse_args(argv)
    opts.pythonpath = os.path.join(os.path.abspath(opts.build), "python")
    opts.features = [] if opts.features == "none" else [f for f in opts.features.split(",") if f]
    return opts


def check(opts):
    """None when torch, its distributed tests and tally's backend import; else what is missing."""
    code = ("import torch.distributed as d; assert d.is_available(), 'torch.distributed is not built in'; "
            "import torch.testing._internal.common_distributed; import tally.torch")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([runner.SHIM, opts.pythonpath]))
    try:
        p = subprocess.run([opts.python, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    except OSError as e:
        return f"{opts.python}: {e}"
    if p.returncode == 0:
        return None
    last = (p.stderr.strip().splitlines() or ["(no message)"])[-1]
    return (f"{opts.python} cannot import torch's distributed tests and tally.torch from {opts.pythonpath}: {last} "
            "(scripts/deps.sh --torch installs PyTorch and libtorch-dev; then rebuild with TALLY_TORCH=AUTO)")


def read_names(path):
    with open(path) as f:
        return {line.split("#", 1)[0].strip() for line in f} - {""}


def select(names, patterns, listed=None):
    if listed is not None:
        names = [n for n in names if n in listed]
    if not patterns:
        return names
    globs = [p if any(ch in p for ch in "*?[") else f"*{p}*" for p in patterns]
    return [n for n in names if any(fnmatch.fnmatchcase(n, g) for g in globs)]


def run_one(opts, backend, world_size, out):
    """Runs one backend at one world size into `out`; returns its results."""
    run_opts = argparse.Namespace(**vars(opts))
    if backend == "gloo":
        run_opts.features = []  # gloo is in every set already; "plugin" is for backends outside torch
    listing = runner.list_tests(run_opts, backend, world_size)
    listed = read_names(opts.tests) if opts.tests else None
    unknown = sorted((listed or set()) - set(listing["tests"]))
    if unknown:
        raise SystemExit(f"{opts.tests} names tests the suite does not have: {', '.join(unknown)}")
    names = select(listing["tests"], opts.patterns, listed)
    if not names:
        raise SystemExit(f"no test of the {len(listing['tests'])} is selected (-k, --tests)")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    meta = {"torch": listing["torch"], "source": listing["source"], "patterns": opts.patterns,
            "tests_file": opts.tests}
    result = runner.Run(run_opts, backend, world_size, names, out, meta).run()
    c = result["counts"]
    print(f"{backend} x{world_size}: {len(names)} tests in {result['seconds']} s: "
          + ", ".join(f"{v} {k}" for k, v in sorted(c.items())) + f"  -> {out}", flush=True)
    return result


def reusable(path, opts, backend):
    """The results in `path` when they were made as asked now and hold every selected test; else None."""
    try:
        with open(path) as f:
            old = json.load(f)
    except (OSError, ValueError):
        return None
    asked = {"features": [] if backend == "gloo" else opts.features, "py311_fix": opts.py311_fix,
             "init_method": opts.init_method}
    if any(old.get(k) != v for k, v in asked.items()):
        print(f"torch_suite: not reusing {path}: made with other options than "
              + ", ".join(f"{k}={v}" for k, v in asked.items()), file=sys.stderr)
        return None
    listed = read_names(opts.tests) if opts.tests else None
    if listed and listed - set(old["tests"]):
        return None
    wanted = select(list(old["tests"]), opts.patterns, listed)
    if (opts.patterns or opts.tests) and not wanted:
        return None
    if any(old["tests"][n]["status"] == "notrun" for n in wanted):
        return None
    old["tests"] = {n: old["tests"][n] for n in wanted}
    return old


def cmd_compare(opts):
    out_dir = opts.out_dir or os.path.join(opts.build, "torch_suite")
    try:
        sizes = [int(s) for s in opts.world_sizes.split(",") if s]
        allow = compare.read_allow(opts.allow)
    except ValueError as e:
        print(f"torch_suite: {e}", file=sys.stderr)
        return 2
    pairs, source = {}, None
    for ws in sizes:
        got = []
        for backend in ("gloo", "tally"):
            path = os.path.join(out_dir, f"{backend}-{ws}.json")
            result = reusable(path, opts, backend) if (opts.reuse or opts.table_only) else None
            if result is None and opts.table_only:
                print(f"torch_suite: --table-only: no usable {path}", file=sys.stderr)
                return 2
            got.append(result or run_one(opts, backend, ws, path))
            source = got[-1].get("source", source)
        pairs[ws] = tuple(got)
    bad = compare.report(pairs, allow, compare.guards(source), sys.stdout)
    print(f"\ntorch_suite: {'FAILED: ' + str(bad) + ' gap(s) or unrun test(s) not in ' + opts.allow if bad else 'ok'}")
    return 1 if bad else 0


def _stop(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through the runner, which kills the running test's session


def main(argv):
    opts = parse(argv)
    signal.signal(signal.SIGTERM, _stop)
    missing = check(opts)
    if missing:
        print(f"torch_suite: skipped: {missing}", file=sys.stderr)
        return SKIPPED
    if opts.command == "check":
        print("torch_suite: torch, its distributed tests and tally.torch import")
        return 0
    if opts.command == "run":
        out = opts.out or os.path.join(opts.build, "torch_suite", f"{opts.backend}-{opts.world_size}.json")
        result = run_one(opts, opts.backend, opts.world_size, out)
        return 1 if any(s in result["counts"] for s in ("fail", "error", "timeout", "notrun")) else 0
    return cmd_compare(opts)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
