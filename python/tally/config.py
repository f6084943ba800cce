"""config.py - the tally_config a communicator is made with, from Python's keyword arguments: the
environment's TALLY_* values (tally_config_from_env) for what the caller does not give, the caller's for
the rest; checked by the library when the communicator is made, which names the field."""
import ctypes
import numbers

from . import errors
from ._lib import lib, Config, LOG_FN, CONFIG_VERSION

TRANSPORTS = {"auto": 0, "shm": 1, "tcp": 2}
ISAS = {"auto": 0, "scalar": 1, "avx2": 2, "avx512": 3}
# Fields the caller may set by name; the words of transport and isa stand for their numbers.
FIELDS = ("rank", "size", "address", "token", "bind", "host", "timeout", "boot_timeout", "transport", "algo",
          "tcp_streams", "shm_large", "shm_cma", "cost_alpha_us", "cost_beta_gbps", "cost_gamma_gbps", "isa",
          "log_level", "flight_depth", "flight_dir", "trace_file", "trace_events")
# A log callback stays installed while any communicator lives, possibly past the Comm that gave it:
# kept here for the life of the process.
_log_callbacks = []


# Fields that are a switch: True and False stand for 1 and 0 (no other field takes a bool).
SWITCHES = ("shm_cma",)


def _word(field, value, words):
    if isinstance(value, str):
        if value.lower() not in words:
            raise ValueError(f"tally: {field}={value!r} is not one of " + ", ".join(words))
        return words[value.lower()]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # 1.7 is no transport
        raise TypeError(f"tally: {field} must be one of " + ", ".join(words) + f" or its number, not {value!r}")
    return int(value)


def _log_fn(log):
    """log(level, line): level is -2 error, -1 warning, 1 decision, 2 detail."""
    fn = LOG_FN(lambda user, level, line: log(level, line.decode(errors="replace")))
    _log_callbacks.append(fn)
    return fn


def make(log=None, **given):
    """A Config: the environment's values, then each given field (None: not given). log: a callable
    log(level, line) that takes the library's log lines instead of stderr (process-wide)."""
    unknown = sorted(k for k in given if k not in FIELDS)
    if unknown:
        raise TypeError("tally: unknown config field " + ", ".join(unknown) + "; the fields are " + ", ".join(FIELDS))
    cfg = Config(struct_size=ctypes.sizeof(Config), version=CONFIG_VERSION)
    rc = lib.tally_config_from_env(ctypes.byref(cfg))
    if rc:
        raise errors.from_code(rc, lib.tally_last_error().decode(errors="replace"))
    for field, value in given.items():
        if value is None:
            continue
        if field == "transport":
            value = _word(field, value, TRANSPORTS)
        elif field == "isa":
            value = _word(field, value, ISAS)
        kind = dict(Config._fields_)[field]
        if field in SWITCHES and isinstance(value, bool):
            value = int(value)
        if kind in (ctypes.c_int, ctypes.c_longlong) and (isinstance(value, bool)
                                                          or not isinstance(value, numbers.Integral)):
            raise TypeError(f"tally: {field} must be an int, not {type(value).__name__} {value!r}")
        if kind is ctypes.c_double and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
            raise TypeError(f"tally: {field} must be a number of seconds or units, not {type(value).__name__} "
                            f"{value!r}")
        if issubclass(kind, ctypes.Array):
            raw = str(value).encode()
            if len(raw) >= ctypes.sizeof(kind):
                raise ValueError(f"tally: {field} is {len(raw)} bytes long; it takes at most {ctypes.sizeof(kind) - 1}")
            value = raw
        setattr(cfg, field, value)
    if given.get("token") is not None:
        cfg.token_derived = 0
    if given.get("rank") is not None or given.get("size") is not None:
        cfg.source = b""
    if log is not None:
        cfg.log_fn = _log_fn(log)
    return cfg
