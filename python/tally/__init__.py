"""tally from Python: the communicator over NumPy arrays (tally.Comm), its errors (tally.Error and one
subclass per code), and `import tally.torch` for PyTorch's "tally" distributed backend."""
from .errors import (Error, InvalidArgument, OutOfMemory, SystemCallError, Timeout, PeerLost, Mismatch, AuthFailed,
                     ProtocolError, BootError, Aborted, Unsupported, Corrupt, NonFinite)
from .comm import Comm, Request, DTYPES, OPS, ANY_SOURCE

__all__ = ["Comm", "Request", "Error", "InvalidArgument", "OutOfMemory", "SystemCallError", "Timeout", "PeerLost",
           "Mismatch", "AuthFailed", "ProtocolError", "BootError", "Aborted", "Unsupported", "Corrupt", "NonFinite",
           "DTYPES", "OPS", "ANY_SOURCE"]
