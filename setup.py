"""setup.py - pip's build of the Python package: runs the project's CMake build (libtally, and PyTorch's
backend where the installing Python has torch) and puts libtally and the backend inside the package."""
import glob
import importlib.util
import os
import re
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))
TORCH_WORDS = ("AUTO", "ON", "OFF")


def project_version():
    """The one version, CMakeLists.txt's project(tally VERSION x.y.z)."""
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(r"project\(tally VERSION ([0-9.]+)", f.read())
    if not m:
        sys.exit("setup.py: CMakeLists.txt has no project(tally VERSION x.y.z) line")
    return m.group(1)


def torch_choice():
    """TALLY_TORCH from the environment (AUTO by default); AUTO without torch in this Python is OFF, so a
    NumPy-only environment does not build a backend against some other torch."""
    word = os.environ.get("TALLY_TORCH", "AUTO").upper()
    if word not in TORCH_WORDS:
        sys.exit(f"setup.py: TALLY_TORCH={os.environ['TALLY_TORCH']!r} is not one of {', '.join(TORCH_WORDS)}")
    has_torch = importlib.util.find_spec("torch") is not None
    if word == "ON" and not has_torch:
        sys.exit(f"setup.py: TALLY_TORCH=ON but {sys.executable} has no torch to build the backend against "
                 "(install torch first; under pip's build isolation it is hidden: pip install --no-build-isolation)")
    if word == "AUTO" and not has_torch:
        print(f"setup.py: {sys.executable} has no torch: building tally without the PyTorch backend (under pip's "
              "build isolation the environment's torch is hidden: pip install --no-build-isolation)", file=sys.stderr)
        return "OFF"
    return word


def cmake_configure(build_dir):
    # Release, no tests (so no test seams), this Python; the source tree's paths mapped away so none is
    # baked into the binaries (torch's checks keep __FILE__).
    prefix_map = f"-ffile-prefix-map={ROOT}/=tally/"
    args = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release", "-DTALLY_TESTS=OFF",
            f"-DTALLY_PYTHON={sys.executable}", f"-DTALLY_TORCH={torch_choice()}",
            f"-DCMAKE_C_FLAGS={os.environ.get('CFLAGS', '')} {prefix_map}",
            f"-DCMAKE_CXX_FLAGS={os.environ.get('CXXFLAGS', '')} {prefix_map}"]
    subprocess.run(args, check=True)


def cmake_build_into(build_dir, package_root):
    """Builds the wheel's target (libtally, the backend when configured) and installs its component, the
    package's binaries and the _where.py that names libtally beside it, under package_root/tally."""
    # setuptools keeps package_root between builds: a backend left from a build with torch must not ride
    # along in one made with TALLY_TORCH=OFF.
    for old in glob.glob(os.path.join(package_root, "tally", "*.so*")):
        os.remove(old)
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
    subprocess.run(["cmake", "--build", build_dir, "--target", "tally_wheel", "-j", jobs], check=True)
    subprocess.run(["cmake", "--install", build_dir, "--component", "tally_wheel", "--prefix",
                    os.path.abspath(package_root)], check=True)


class BuildWithCMake(build_py):
    """build_py copies the .py files; CMake adds what is compiled."""

    def run(self):
        super().run()
        build_temp = self.get_finalized_command("build").build_temp
        build_dir = os.path.abspath(os.path.join(build_temp, "cmake"))
        cmake_configure(build_dir)
        cmake_build_into(build_dir, self.build_lib)


class BinaryDistribution(Distribution):
    """libtally and the backend are built for this platform and Python: a platform wheel, never a pure one."""

    def has_ext_modules(self):
        return True


setup(
    version=project_version(),
    packages=["tally"],
    package_dir={"": "python"},
    cmdclass={"build_py": BuildWithCMake},
    distclass=BinaryDistribution,
    # build/ is CMake's build folder by the project's habit: pip's in-tree build keeps to its own.
    options={"build": {"build_base": "build-pip"}},
)
