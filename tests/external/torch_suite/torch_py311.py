"""torch_py311 - lets PyTorch 1.13's torch.distributed._shard import under Python 3.11 (Debian's pairing), in
the processes of this suite only: the module's source is amended as it is loaded, nothing on disk changes.

sharded_tensor/metadata.py gives a dataclass field an instance default, which 3.11's dataclasses refuse
(ValueError: mutable default ... use default_factory). TestDistBackend._run turns on DDP's ReplicatedTensor
path, which imports that module, so without this every DDP test fails on every backend, Gloo included.
PyTorch 2.0 changed that one field to a default_factory (pytorch/pytorch#91795); this does the same."""
import importlib.abc
import importlib.machinery
import sys

MODULE = "torch.distributed._shard.sharded_tensor.metadata"
REFUSED = b"field(default=TensorProperties())"
ACCEPTED = b"field(default_factory=TensorProperties)"


class _Loader(importlib.machinery.SourceFileLoader):
    """Compiles the amended source every time: never reads or writes the module's cached bytecode, which
    belongs to the installed PyTorch."""

    def get_code(self, fullname):
        source = self.get_data(self.path).replace(REFUSED, ACCEPTED)
        return compile(source, self.path, "exec", dont_inherit=True)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return spec
        with open(spec.origin, "rb") as f:
            if REFUSED not in f.read():
                return spec  # a PyTorch that has the fix already
        spec.loader = _Loader(name, spec.origin)
        return spec


def install():
    """Amends the module when it is imported next, on Python 3.11 and later (earlier ones accept it as is)."""
    if sys.version_info >= (3, 11) and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
