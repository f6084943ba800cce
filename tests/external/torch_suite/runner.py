"""runner - runs PyTorch's _DistTestBase tests for one backend and world size under a per-test and a
whole-run time limit, in worker processes of suite_one.py, and keeps one result per test as JSON.

A worker runs the tests it is given in turn, in its own session; a test past its limit gets its whole session
killed (the worker and every rank it spawned) and the next worker starts at the test after it, so no hang
outlives its limit. The JSON is rewritten after every test, so an interrupted run keeps what it has."""
import datetime
import json
import os
import signal
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ONE = os.path.join(HERE, "suite_one.py")
SHIM = os.path.join(HERE, "shim")
POLL_S = 0.2


def suite_env(opts, backend, world_size, temp_dir):
    """The environment test_distributed_spawn.py expects (as PyTorch's run_test.py sets it), and the path to
    this folder (suite_cases), the expecttest stand-in and tally's package."""
    env = dict(os.environ)
    path = [HERE, SHIM, opts.pythonpath] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    init = "env://" if opts.init_method == "env" else f"file://{temp_dir}/"
    env.update(BACKEND=backend, WORLD_SIZE=str(world_size), TEMP_DIR=temp_dir, INIT_METHOD=init,
               PYTHONPATH=os.pathsep.join(path), PYTHONUNBUFFERED="1",
               TORCH_SUITE_FEATURES=",".join(opts.features), TORCH_SUITE_PY311_FIX="1" if opts.py311_fix else "0",
               # PyTorch's own join gives up first (and logs the ranks' stacks); the runner's kill is the backstop.
               DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(max(5, opts.test_limit - 10)))
    return env


def list_tests(opts, backend, world_size):
    """The suite's test names and provenance, from a process that imports it as the runs will."""
    with tempfile.TemporaryDirectory(prefix="torch_suite_") as tmp:
        os.mkdir(os.path.join(tmp, "barrier"))
        env = suite_env(opts, backend, world_size, tmp)
        p = subprocess.run([opts.python, ONE, "--list"], env=env, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"listing the suite with BACKEND={backend} failed (exit {p.returncode}):\n"
                           + p.stderr[-3000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def kill_session(proc):
    """SIGKILL every process of the worker's session (its ranks stay in it), then reap the worker."""
    sid = proc.pid
    for pid in _session_members(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(sid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _session_members(sid):
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp session ...
        if len(fields) > 3 and int(fields[3]) == sid:
            members.append(int(entry))
    return members


class Lines:
    """Reads the JSON lines a worker appends to its results file, a whole line at a time."""

    def __init__(self, path):
        self.path, self.offset, self.rest = path, 0, ""

    def new(self):
        try:
            with open(self.path) as f:
                f.seek(self.offset)
                chunk = f.read()
                self.offset = f.tell()
        except FileNotFoundError:
            return []
        text = self.rest + chunk
        *whole, self.rest = text.split("\n")
        return [json.loads(line) for line in whole if line.strip()]


class Run:
    """One backend at one world size: the tests to do, their results, the limits."""

    def __init__(self, opts, backend, world_size, names, out_path, meta):
        self.opts, self.backend, self.world_size = opts, backend, world_size
        self.todo, self.results, self.out_path = list(names), {}, out_path
        self.logdir = os.path.splitext(out_path)[0] + ".logs"
        self.started = time.monotonic()
        self.deadline = self.started + opts.run_limit
        self.meta = dict(meta, backend=backend, world_size=world_size, features=opts.features,
                         init_method=opts.init_method, py311_fix=opts.py311_fix, test_limit_s=opts.test_limit,
                         run_limit_s=opts.run_limit,
                         started=datetime.datetime.now().isoformat(timespec="seconds"))

    def run(self):
        os.makedirs(self.logdir, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="torch_suite_") as tmp:
            for name in ("barrier", "test_dir"):
                os.mkdir(os.path.join(tmp, name))
            env = suite_env(self.opts, self.backend, self.world_size, tmp)
            attempt = 0
            while self.todo and time.monotonic() < self.deadline:
                attempt += 1
                self._worker(env, os.path.join(tmp, f"results.{attempt}.jsonl"))
        for name in list(self.todo):  # _done takes each out of todo
            self._done(name, status="notrun", seconds=0, error="the whole-run limit "
                       f"({self.opts.run_limit} s) passed before this test started")
        return self.summary()

    def _worker(self, env, results_path):
        """One suite_one.py over the tests left, until they are done, one overruns or the worker ends."""
        with open(os.path.join(self.logdir, "worker.log"), "a") as log:
            proc = subprocess.Popen([self.opts.python, ONE, results_path, self.logdir] + self.todo, env=env,
                                    stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        self.lines, self.current, self.t0 = Lines(results_path), None, None
        try:
            while self.todo:
                ended = proc.poll() is not None  # read after polling: its last lines are in by then
                self._consume()
                if ended:
                    return self._ended(proc.returncode)
                now = time.monotonic()
                if self.current and now - self.t0 > self.opts.test_limit:
                    return self._overran(f"did not end within the per-test limit ({self.opts.test_limit} s): "
                                         "its ranks were killed")
                if now > self.deadline:
                    return self._overran(f"the whole-run limit ({self.opts.run_limit} s) passed during this "
                                         "test: its ranks were killed")
                time.sleep(POLL_S)
        finally:
            kill_session(proc)  # also the ranks a worker that ended left behind

    def _consume(self):
        for ev in self.lines.new():
            if ev.pop("event") == "start":
                self.current, self.t0 = ev["test"], time.monotonic()
            else:
                self.current = None
                self._done(ev.pop("test"), **ev)

    def _ended(self, code):
        """The worker ended with tests left: the one it was in errs (a crash); if it was in none, the next
        one does, so that a worker that cannot start is not restarted forever."""
        if self.current:
            self._done(self.current, status="error", seconds=round(time.monotonic() - self.t0, 2),
                       error=f"the worker ended during the test (exit status {code})",
                       log=os.path.join(self.logdir, self.current + ".log"))
        elif self.todo:
            self._done(self.todo[0], status="error", seconds=0,
                       error=f"the worker ended before this test started (exit status {code}): see worker.log")

    def _overran(self, why):
        if self.current:
            seconds = round(time.monotonic() - self.t0, 2)
            self._done(self.current, status="timeout", seconds=seconds, error=why,
                       log=os.path.join(self.logdir, self.current + ".log"))

    def _done(self, name, **rec):
        if name in self.todo:
            self.todo.remove(name)
        if rec.get("status") == "pass" and not self.opts.keep_logs and rec.get("log"):
            try:
                os.unlink(rec.pop("log"))
            except OSError:
                pass
        self.results[name] = rec
        shown = rec.get("error") or rec.get("reason") or ""
        self._progress(f"{name}: {rec['status']} {rec.get('seconds', 0)} s {shown[:100]}")
        self._save()

    def _progress(self, text):
        if self.opts.verbose:
            done = len(self.results)
            print(f"[{self.backend} x{self.world_size} {done}/{done + len(self.todo)}] {text}", flush=True)

    def summary(self):
        counts = {}
        for rec in self.results.values():
            counts[rec["status"]] = counts.get(rec["status"], 0) + 1
        return dict(self.meta, seconds=round(time.monotonic() - self.started, 1), counts=counts,
                    tests=dict(sorted(self.results.items())))

    def _save(self):
        tmp = self.out_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.summary(), f, indent=1)
            f.write("\n")
        os.replace(tmp, self.out_path)
