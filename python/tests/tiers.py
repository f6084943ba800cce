"""tiers.py - which of a test's cases run: TALLY_TEST_TIER (quick, long or external, set by ctest from
tests/CMakeLists.txt) names one tier; unset, a test run by hand runs every case."""
import os
import sys

TIERS = ("quick", "long", "external")


def wants(tier):
    """True when the cases of `tier` run in this process."""
    chosen = os.environ.get("TALLY_TEST_TIER", "")
    if chosen and chosen not in TIERS:
        print(f"TALLY_TEST_TIER='{chosen}': expected quick, long or external (or unset for all)", file=sys.stderr)
        sys.exit(2)
    return chosen in ("", tier)
