#!/usr/bin/env bash
# deps.sh - installs the Debian packages tally's build, main job and tests need that are not installed,
# in one apt-get install; asks dpkg (or pkg-config) about each, never a file another package may provide;
# with them, pip install of the Python package works offline (the backend's build needs --torch's too).
# Run by run.sh and test.sh; safe to run twice. --fresh-check adds what scripts/fresh-check.sh needs;
# --torch adds PyTorch's C++ and Python packages for the tally backend (test.sh); --tests adds those,
# chromium, which renders the SVG charts the CLI writes (tests/cli/test_charts.c), and QEMU's user mode, which
# runs the kernels' AVX2 and SSE builds on any x86-64 (tests/isa/run.sh): test.sh --full and --external.
set -eu

# package | why it is needed
tally_deps=(
  "build-essential|the C compiler, make and the C library's headers"
  "cmake|the build (CMake 3.25 or later)"
  "pkg-config|CMake finds OpenBLAS through its pkg-config module"
  "libopenblas-dev|GEMM for the layers (the pkg-config module openblas; the reference BLAS is not enough)"
  "zlib1g-dev|reading .gz IDX files"
  "libssl-dev|HMAC-SHA256 peer authentication and randomness (OpenSSL)"
  "libisal-dev|CRC32C of checkpoint files (ISA-L's crc32_iscsi)"
  "libdnnl-dev|oneDNN: --precision bf16's products on AMX or AVX512_BF16 (headers at build, the library opened at run time)"
  "bible-kjv|the main job's text: the King James Bible, the default corpus of --model gpt"
  "dataset-fashion-mnist|the MLP's data set (./run.sh --mlp)"
  "openmpi-bin|mpirun: the test that starts the installed library under Open MPI, and the benchmark peer"
  "libopenmpi-dev|Open MPI's headers: the benchmark peer"
  "python3-numpy|the Python package's tests and examples (tally.Comm over NumPy arrays)"
  "python3-venv|pip install of the Python package into a virtual environment (docs/python.md)"
  "python3-pip|pip, which installs the Python package (pyproject.toml)"
  "python3-setuptools|the Python package's build backend (setup.py runs CMake)"
  "python3-wheel|pip install --no-build-isolation and pip wheel build the package as a wheel"
)
case "${1:-}" in
  "") ;;
  --fresh-check) tally_deps+=("debootstrap|scripts/fresh-check.sh builds a Debian 12 root with it") ;;
  --torch | --tests) # about 200 MB: only for PyTorch's tally backend (built when these are there) and its tests
    tally_deps+=("python3-torch|PyTorch for Python: the tally backend's tests, and the peers DDP is timed against"
      "libtorch-dev|PyTorch's C++ headers and libraries: the tally backend (python/torch_backend) is built against them"
      "python3-dev|Python's headers, for the backend's module"
      "pybind11-dev|pybind11's headers, which PyTorch's C++ headers include (python3-torch only recommends it)")
    if [ "$1" = --tests ]; then
      tally_deps+=("chromium|headless rendering of the SVG charts (--plot, --svg) in tests/cli/test_charts.c"
        "qemu-user|the kernels' AVX2 and SSE builds run as a Haswell and a Nehalem would, in tests/isa/run.sh")
    fi
    ;;
  *)
    echo "deps.sh: unknown argument '$1' (it takes --fresh-check, --torch or --tests)" >&2
    exit 2
    ;;
esac

tally_installed() { # dpkg's word, or for OpenBLAS an openblas.pc that pkg-config finds (a build of one's own)
  [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ] && return 0
  [ "$1" = libopenblas-dev ] && command -v pkg-config >/dev/null && pkg-config --exists openblas
}

tally_missing=()
for entry in "${tally_deps[@]}"; do
  pkg=${entry%%|*}
  tally_installed "$pkg" || tally_missing+=("$pkg")
done
[ ${#tally_missing[@]} -eq 0 ] && exit 0

echo "deps.sh: ${#tally_missing[@]} Debian package(s) missing:"
for entry in "${tally_deps[@]}"; do
  for pkg in "${tally_missing[@]}"; do
    [ "$pkg" = "${entry%%|*}" ] && printf '  %-22s %s\n' "$pkg" "${entry#*|}"
  done
done

tally_cannot() {
  {
    echo "deps.sh: cannot install the packages tally needs: $1"
    echo "  missing: ${tally_missing[*]}"
    echo "  install them as root, then run this again:"
    echo "    apt-get update && apt-get install --no-install-recommends ${tally_missing[*]}"
  } >&2
  exit 1
}

as_root=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || tally_cannot "not running as root and sudo is not installed"
  as_root=(sudo)
fi
command -v apt-get >/dev/null || tally_cannot "apt-get is not available (tally's install script knows Debian's packages)"
if [ ${#as_root[@]} -gt 0 ]; then # sudo asks for a password here if it must, or fails at once without a terminal
  sudo apt-get --version >/dev/null ||
    tally_cannot "sudo would not run apt-get as root for $(id -un) (see above: not allowed by sudoers, or it needs a password and there is no terminal to ask on)"
fi
"${as_root[@]}" apt-get update -qq || tally_cannot "apt-get update failed (see above)"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  "${tally_missing[@]}" >/dev/null || tally_cannot "apt-get install failed (see above)"
echo "deps.sh: installed ${tally_missing[*]}"
