"""expecttest - a stand-in for the expecttest package (Debian has none), which PyTorch's test helpers
import: torch.testing._internal.common_utils reads ACCEPT and subclasses TestCase, nothing more."""
import unittest

# common_utils sets it from its --accept flag; only assertExpected (unused by the distributed tests) reads it.
ACCEPT = False


class TestCase(unittest.TestCase):
    """The base class common_utils.TestCase extends; expecttest's own adds assertExpectedInline, which
    the distributed tests never call."""
