"""tally from Python: the communicator over NumPy arrays (tally.Comm), its errors (tally.Error and one
subclass per code), and `import tally.torch` for PyTorch's "tally" distributed backend."""
try:
    import numpy  # noqa: F401  tally.Comm takes and gives NumPy arrays
except ImportError as e:
    # One line that says what to install, not a traceback from deep inside the package.
    raise ImportError(f"tally needs NumPy ({e}): pip install numpy, or use Debian's python3-numpy "
                      "(a venv made with --system-site-packages sees it)") from None

from .errors import (Error, InvalidArgument, OutOfMemory, SystemCallError, Timeout, PeerLost, Mismatch, AuthFailed,
                     ProtocolError, BootError, Aborted, Unsupported, Corrupt, NonFinite)
from .comm import Comm, Request, DTYPES, OPS, ANY_SOURCE

__all__ = ["Comm", "Request", "Error", "InvalidArgument", "OutOfMemory", "SystemCallError", "Timeout", "PeerLost",
           "Mismatch", "AuthFailed", "ProtocolError", "BootError", "Aborted", "Unsupported", "Corrupt", "NonFinite",
           "DTYPES", "OPS", "ANY_SOURCE"]
