#!/usr/bin/env bash
# Installs the Debian packages tally needs to build and test, when they are missing (needs root or sudo).
# Sourced by run.sh and test.sh; safe to run twice.
set -eu
tally_need=()
command -v cmake >/dev/null || tally_need+=(cmake)
command -v gcc >/dev/null || tally_need+=(build-essential)
command -v pkg-config >/dev/null || tally_need+=(pkg-config)
command -v mpirun >/dev/null || tally_need+=(openmpi-bin libopenmpi-dev)
[ -f /usr/include/openssl/hmac.h ] || tally_need+=(libssl-dev)
[ -f /usr/include/zlib.h ] || tally_need+=(zlib1g-dev)
[ -f /usr/include/x86_64-linux-gnu/cblas.h ] || [ -f /usr/include/cblas.h ] || tally_need+=(libopenblas-dev)
[ -d /usr/share/datasets/fashion-mnist ] || tally_need+=(dataset-fashion-mnist)
if [ ${#tally_need[@]} -gt 0 ]; then
  echo "installing: ${tally_need[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${tally_need[@]}" >/dev/null
fi
