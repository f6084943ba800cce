"""verdict.py - a test rank's tally of checks, and the one line test_numpy.py and test_torch.py read back:
"result RANK PASSED FAILED [what failed]"."""
passed, failed = 0, []


def check(ok, what):
    global passed
    if ok:
        passed += 1
    else:
        failed.append(what)


def report(rank):
    print(f"result {rank} {passed} {len(failed)} {'; '.join(failed[:5])}", flush=True)
