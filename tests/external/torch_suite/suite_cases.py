"""suite_cases - PyTorch's DistributedTest._DistTestBase made into a runnable class the way PyTorch's own
test/distributed/test_distributed_spawn.py makes it, for the backend named by BACKEND (tally included).

Every process that unpickles the class imports this module, the ranks multiprocessing spawns included: so
`import tally.torch` here registers the backend in each of them before init_process_group. TORCH_SUITE_FEATURES
(comma-separated DistTestCases.backend_feature names) adds BACKEND to those sets before distributed_test.py's
decorators read them, in the parent and in the ranks alike, so a test is skipped or run the same in both.
TORCH_SUITE_PY311_FIX=1 (the runner's default) first applies torch_py311's amendment of PyTorch 1.13 for
Python 3.11, without which no DDP test can pass on any backend."""
import os

if os.environ.get("TORCH_SUITE_PY311_FIX") == "1":
    import torch_py311

    torch_py311.install()

import torch  # noqa: E402

BACKEND = os.environ["BACKEND"]
if BACKEND == "tally":
    import tally.torch  # noqa: F401  (registers "tally" with torch.distributed)

from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402


def _add_features():
    for name in filter(None, os.environ.get("TORCH_SUITE_FEATURES", "").split(",")):
        if name not in DistTestCases.backend_feature:
            known = ", ".join(sorted(DistTestCases.backend_feature))
            raise SystemExit(f"TORCH_SUITE_FEATURES names '{name}': torch's DistTestCases.backend_feature has {known}")
        DistTestCases.backend_feature[name].add(BACKEND)


_add_features()

from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """One test: setUp spawns WORLD_SIZE ranks, each runs the test's body; the parent joins them."""

    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


def test_names():
    """Every test of the class, parametrized ones expanded, in unittest's order."""
    return sorted(n for n in dir(TestDistBackendWithSpawn) if n.startswith("test_"))

