"""tally.torch - importing it registers "tally" with torch.distributed, so that
dist.init_process_group("tally") and an unchanged DistributedDataParallel run on tally's collectives
(under torchrun, tally run, mpirun, srun, or mp.spawn with MASTER_ADDR/MASTER_PORT)."""
import datetime
import os
import secrets
import socket

import torch.distributed as dist

from . import config

try:
    from . import _torch_backend
except ImportError as e:
    raise ImportError("tally.torch: cannot load the PyTorch backend (" + str(e) + "). It is built only where "
                      "torch 1.13 and its C++ headers are there at build time, and loads only with the torch it "
                      "was built against: with pip, install torch first, then reinstall tally (TALLY_TORCH=ON "
                      "makes that build fail where the backend cannot be built); with CMake, "
                      "scripts/deps.sh --torch, then rebuild (docs/python.md)") from e

ProcessGroupTally = _torch_backend.ProcessGroupTally


def _my_address():
    """The address the other ranks reach this one at: TALLY_ADDR's host when given, else the local end of
    the route to MASTER_ADDR (the host torch's store is on), else this host's name."""
    given = os.environ.get("TALLY_ADDR")
    if given and ":" in given:
        return given.rsplit(":", 1)[0]
    master = os.environ.get("MASTER_ADDR")
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((master, 9))  # no packet is sent: this only picks the route
                return s.getsockname()[0]
        except OSError:
            pass
    return socket.gethostname()


def _free_port(host):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host if host[0].isdigit() else "", 0))
        return s.getsockname()[1]


def _create(store, rank, size, timeout):
    """torch.distributed's creator: the ranks agree on tally's rendezvous through torch's store (rank 0
    says where it listens and the token), then make the communicator from a config with them (and the
    environment's TALLY_* for the rest), handed to the backend as the struct's bytes."""
    given = {"rank": rank, "size": size}
    if size > 1:
        if rank == 0:
            host = _my_address()
            store.set("tally/addr", f"{host}:{_free_port(host)}")
            store.set("tally/token", os.environ.get("TALLY_TOKEN") or secrets.token_hex(16))
        given["address"] = store.get("tally/addr").decode()
        given["token"] = store.get("tally/token").decode()
    if "TALLY_TIMEOUT" not in os.environ and isinstance(timeout, datetime.timedelta):
        given["timeout"] = max(1.0, timeout.total_seconds())
    return ProcessGroupTally(rank, size, bytes(config.make(**given)))


if "TALLY" not in getattr(dist.Backend, "_plugins", {}):
    dist.Backend.register_backend("tally", _create)
