"""_lib.py - finds and loads libtally (the shared library the build, `cmake --install` or pip's wheel put
where _where.py says) and declares the C signatures the package calls; no compiler is needed at import."""
import ctypes
import ctypes.util
import os

try:
    from . import _where  # written by the build, cmake --install and pip's wheel: where libtally lies
except ImportError:  # the source tree itself, not a build of it
    _where = None


def _candidates():
    env = os.environ.get("TALLY_LIBRARY")
    if env:
        yield env, "TALLY_LIBRARY"
        return
    if _where is not None:
        yield _where.LIBRARY, "the package's libtally (_where.py)"
    found = ctypes.util.find_library("tally")
    if found:
        yield found, "the system's libtally"


def _load():
    tried = []
    for path, what in _candidates():
        try:
            return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            tried.append(f"{what} {path}: {e}")
    raise ImportError("tally: cannot load libtally.so ("
                      + ("; ".join(tried) if tried else "none found")
                      + "). Install the package with pip (pip install --no-build-isolation . in tally's source "
                        "tree), or build tally (cmake --build build) and import it from build/python, or "
                        "cmake --install it, or set TALLY_LIBRARY to the library's path.")


lib = _load()
c_comm_p = ctypes.c_void_p
c_req_p = ctypes.c_void_p
c_sizes_p = ctypes.POINTER(ctypes.c_size_t)
DONE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)
LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)
CONFIG_VERSION = 1  # TALLY_CONFIG_VERSION of the struct below


class Config(ctypes.Structure):
    """include/tally.h's tally_config, field for field (docs/config.md says what each one means)."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("version", ctypes.c_int),
        ("rank", ctypes.c_int),
        ("size", ctypes.c_int),
        ("address", ctypes.c_char * 272),
        ("token", ctypes.c_char * 256),
        ("bind", ctypes.c_char * 256),
        ("host", ctypes.c_char * 64),
        ("timeout", ctypes.c_double),
        ("boot_timeout", ctypes.c_double),
        ("transport", ctypes.c_int),
        ("algo", ctypes.c_char * 32),
        ("tcp_streams", ctypes.c_int),
        ("shm_large", ctypes.c_longlong),
        ("shm_cma", ctypes.c_int),
        ("cost_alpha_us", ctypes.c_double),
        ("cost_beta_gbps", ctypes.c_double),
        ("cost_gamma_gbps", ctypes.c_double),
        ("isa", ctypes.c_int),
        ("log_level", ctypes.c_int),
        ("log_fn", LOG_FN),
        ("log_user", ctypes.c_void_p),
        ("flight_depth", ctypes.c_int),
        ("flight_dir", ctypes.c_char * 449),
        ("trace_file", ctypes.c_char * 1024),
        ("trace_events", ctypes.c_int),
        ("source", ctypes.c_char * 16),
        ("token_derived", ctypes.c_int),
    ]


_sigs = {
    "tally_comm_init": (ctypes.c_int, [ctypes.POINTER(c_comm_p)]),
    "tally_comm_init_config": (ctypes.c_int, [ctypes.POINTER(c_comm_p), ctypes.POINTER(Config)]),
    "tally_config_from_env": (ctypes.c_int, [ctypes.POINTER(Config)]),
    "tally_comm_rank": (ctypes.c_int, [c_comm_p]),
    "tally_comm_size": (ctypes.c_int, [c_comm_p]),
    "tally_comm_free": (ctypes.c_int, [c_comm_p]),
    "tally_comm_abort": (ctypes.c_int, [c_comm_p]),
    "tally_comm_transport": (ctypes.c_char_p, [c_comm_p]),
    "tally_comm_algo_for": (ctypes.c_char_p, [c_comm_p, ctypes.c_size_t]),
    "tally_comm_large_path": (ctypes.c_char_p, [c_comm_p]),
    "tally_comm_mem_min": (ctypes.c_size_t, [c_comm_p]),
    "tally_allreduce": (ctypes.c_int, [c_comm_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                       ctypes.c_int]),
    "tally_reduce_scatter": (ctypes.c_int, [c_comm_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                            ctypes.c_int, ctypes.c_int]),
    "tally_allgather": (ctypes.c_int, [c_comm_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]),
    "tally_broadcast": (ctypes.c_int, [c_comm_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]),
    "tally_barrier": (ctypes.c_int, [c_comm_p]),
    "tally_iallreduce": (ctypes.c_int, [c_comm_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                        ctypes.c_int, ctypes.POINTER(c_req_p)]),
    "tally_ireduce_scatter": (ctypes.c_int, [c_comm_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                             ctypes.c_int, ctypes.c_int, ctypes.POINTER(c_req_p)]),
    "tally_iallgather": (ctypes.c_int, [c_comm_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                        ctypes.POINTER(c_req_p)]),
    "tally_ibroadcast": (ctypes.c_int, [c_comm_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                        ctypes.POINTER(c_req_p)]),
    "tally_ibarrier": (ctypes.c_int, [c_comm_p, ctypes.POINTER(c_req_p)]),
    "tally_reduce": (ctypes.c_int, [c_comm_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                    ctypes.c_int, ctypes.c_int]),
    "tally_gather": (ctypes.c_int, [c_comm_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                    ctypes.c_int]),
    "tally_scatter": (ctypes.c_int, [c_comm_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                     ctypes.c_int]),
    "tally_alltoall": (ctypes.c_int, [c_comm_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]),
    "tally_alltoallv": (ctypes.c_int, [c_comm_p, ctypes.c_void_p, c_sizes_p, c_sizes_p, ctypes.c_void_p, c_sizes_p,
                                       c_sizes_p, ctypes.c_int]),
    "tally_isend": (ctypes.c_int, [c_comm_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                   ctypes.c_int, ctypes.POINTER(c_req_p)]),
    "tally_irecv": (ctypes.c_int, [c_comm_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                   ctypes.c_int, ctypes.POINTER(c_req_p)]),
    "tally_ireduce": (ctypes.c_int, [c_comm_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                     ctypes.c_int, ctypes.c_int, ctypes.POINTER(c_req_p)]),
    "tally_igather": (ctypes.c_int, [c_comm_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                     ctypes.c_int, ctypes.POINTER(c_req_p)]),
    "tally_iscatter": (ctypes.c_int, [c_comm_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                      ctypes.c_int, ctypes.POINTER(c_req_p)]),
    "tally_ialltoall": (ctypes.c_int, [c_comm_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                       ctypes.POINTER(c_req_p)]),
    "tally_ialltoallv": (ctypes.c_int, [c_comm_p, ctypes.c_void_p, c_sizes_p, c_sizes_p, ctypes.c_void_p, c_sizes_p,
                                        c_sizes_p, ctypes.c_int, ctypes.POINTER(c_req_p)]),
    "tally_request_source": (ctypes.c_int, [c_req_p]),
    "tally_wait": (ctypes.c_int, [c_req_p]),
    "tally_test": (ctypes.c_int, [c_req_p, ctypes.POINTER(ctypes.c_int)]),
    "tally_wait_for": (ctypes.c_int, [c_req_p, ctypes.c_double, ctypes.POINTER(ctypes.c_int)]),
    "tally_request_free": (ctypes.c_int, [c_req_p]),
    "tally_mem_alloc": (ctypes.c_void_p, [c_comm_p, ctypes.c_size_t]),
    "tally_mem_free": (ctypes.c_int, [c_comm_p, ctypes.c_void_p]),
    "tally_mem_keep": (ctypes.c_int, [c_comm_p, ctypes.c_void_p]),
    "tally_mem_release": (ctypes.c_int, [ctypes.c_void_p]),
    "tally_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "tally_last_error": (ctypes.c_char_p, []),
}
for _name, (_res, _args) in _sigs.items():
    _fn = getattr(lib, _name)
    _fn.restype, _fn.argtypes = _res, _args
