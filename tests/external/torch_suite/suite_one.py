"""suite_one - runs named _DistTestBase tests one after another in this process (each spawns its ranks) and
appends a JSON line to RESULTS as each starts and ends; the runner (runner.py) watches that file and kills
this process group when a test overruns. Each test's output, its ranks' included, goes to LOGDIR/NAME.log.

usage: suite_one.py RESULTS LOGDIR TEST...   |   suite_one.py --list   (the tests and where they come from)
The environment is the suite's: BACKEND, WORLD_SIZE, TEMP_DIR, INIT_METHOD (runner.py sets them)."""
import json
import os
import re
import sys
import time
import traceback
import unittest

# Rank-level skips exit with code 86 and say why only in the rank's log (common_distributed.run_test).
RANK_SKIP = re.compile(r"skipping test (\S+) for following reason: (.*)")
CHILD_ERROR = re.compile(r"Process (\d+) exited with error code \d+ and exception:")


class Outcome(unittest.TestResult):
    """What happened to one test: its status, the skip reason, the first error."""

    def __init__(self):
        super().__init__()
        self.status, self.reason, self.err = "pass", None, None

    def _bad(self, status, err):
        if self.err is None:  # an error in tearDown after a failure must not hide the failure
            self.status, self.err = status, err

    def addError(self, test, err):
        self._bad("error", err)

    def addFailure(self, test, err):
        self._bad("fail", err)

    def addSkip(self, test, reason):
        self.status, self.reason = "skip", reason

    def addUnexpectedSuccess(self, test):
        self._bad("fail", (AssertionError, AssertionError("unexpected success"), None))


def exception_line(text):
    """The line that names an exception in a traceback's text: the first unindented line after the
    'Traceback' header and its frames; None when there is none."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last):"):
            for later in lines[i + 1:]:
                if later.strip() and not later.startswith((" ", "\t")):
                    return later.strip()
    return None


def rank_errors(text):
    """Each failed rank's exception line, in rank order, from the parent's report of them."""
    marks = list(CHILD_ERROR.finditer(text))
    found = []
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        line = exception_line(text[m.end():end])
        if line:
            found.append([int(m.group(1)), line])
    return found


def error_lines(err):
    """For the table: the first failed rank's exception (that is where the backend's message is) and every
    failed rank's; without a rank's, the parent's exception and its message's first line."""
    etype, value, _ = err
    text = str(value)
    ranks = rank_errors(text)
    if ranks:
        return ranks[0][1], ranks
    first = text.strip().splitlines()[0] if text.strip() else ""
    return (f"{etype.__name__}: {first}" if first else etype.__name__), []


def detail(err, limit=4000):
    """The error's text without c10's C++ frame lists (the rank's log keeps them), cut at `limit`."""
    text = "".join(traceback.format_exception(*err))
    text = "".join(line for line in text.splitlines(True) if not line.startswith("frame #"))
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more characters)"


def rank_skip_reason(log_path, name):
    try:
        with open(log_path, errors="replace") as f:
            for line in f:
                m = RANK_SKIP.search(line)
                if m and m.group(1) == name:
                    return m.group(2).strip()
    except OSError:
        pass
    return None


def record(results, **fields):
    results.write(json.dumps(fields) + "\n")
    results.flush()


def redirect_output(path):
    """Points this process's stdout and stderr (and so the ranks it spawns next) at the test's log."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def run_one(cls, name, results, logdir):
    log = os.path.join(logdir, name + ".log")
    redirect_output(log)
    record(results, event="start", test=name)
    outcome = Outcome()
    t0 = time.monotonic()
    cls(name).run(outcome)
    seconds = round(time.monotonic() - t0, 2)
    rec = {"event": "end", "test": name, "status": outcome.status, "seconds": seconds, "log": log}
    if outcome.status == "skip":
        reason = outcome.reason or ""
        if reason.startswith("Test skipped at subprocess level"):
            reason = rank_skip_reason(log, name) or reason
        rec["reason"] = reason
    elif outcome.err is not None:
        rec["error"], ranks = error_lines(outcome.err)
        if ranks:
            rec["rank_errors"] = ranks
        rec["detail"] = detail(outcome.err)
    record(results, **rec)


def main():
    args = sys.argv[1:]
    # torch's common_utils parses sys.argv when imported, and spawned ranks are handed the parent's.
    sys.argv = sys.argv[:1]
    import suite_cases
    import torch
    import torch.testing._internal.distributed.distributed_test as dt

    if args == ["--list"]:
        print(json.dumps({"tests": suite_cases.test_names(), "torch": torch.__version__, "source": dt.__file__}))
        return 0
    if len(args) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    results_path, logdir, names = args[0], args[1], args[2:]
    known = set(suite_cases.test_names())
    with open(results_path, "a") as results:
        for name in names:
            if name not in known:
                record(results, event="end", test=name, status="error", seconds=0,
                       error=f"no test named {name} in DistributedTest._DistTestBase")
                continue
            run_one(suite_cases.TestDistBackendWithSpawn, name, results, logdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
