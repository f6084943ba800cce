"""errors.py - tally's error codes as Python exceptions: each a tally.Error subclass carrying the code and
tally's message (which rank, which collective, what to do)."""


class Error(RuntimeError):
    """A tally call failed. code: the TALLY_E_* value (negative); name: its name without the prefix."""
    code = 0
    name = "UNKNOWN"

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = code


class InvalidArgument(Error, ValueError):
    code, name = -1, "INVALID"


class OutOfMemory(Error, MemoryError):
    code, name = -2, "NOMEM"


class SystemCallError(Error, OSError):
    code, name = -3, "SYSTEM"


class Timeout(Error, TimeoutError):
    code, name = -4, "TIMEOUT"


class PeerLost(Error, ConnectionError):
    code, name = -5, "PEER_LOST"


class Mismatch(Error):
    code, name = -6, "MISMATCH"


class AuthFailed(Error, PermissionError):
    code, name = -7, "AUTH"


class ProtocolError(Error):
    code, name = -8, "PROTOCOL"


class BootError(Error):
    code, name = -9, "BOOT"


class Aborted(Error):
    code, name = -10, "ABORTED"


class Unsupported(Error, NotImplementedError):
    code, name = -11, "UNSUPPORTED"


class Corrupt(Error):
    code, name = -12, "CORRUPT"


class NonFinite(Error, ArithmeticError):
    code, name = -13, "NONFINITE"


BY_CODE = {cls.code: cls for cls in (InvalidArgument, OutOfMemory, SystemCallError, Timeout, PeerLost, Mismatch,
                                     AuthFailed, ProtocolError, BootError, Aborted, Unsupported, Corrupt, NonFinite)}


def from_code(code, message):
    """The exception for a TALLY_E_* code, with tally's message."""
    cls = BY_CODE.get(code, Error)
    return cls(f"TALLY_E_{cls.name}: {message}" if message else f"TALLY_E_{cls.name}", code)
