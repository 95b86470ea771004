#!/usr/bin/env bash
# Installs everything xsilo needs from Debian 12 packages, and any packages named as arguments
# (scripts/fuzz.sh asks for clang). Safe to run again: packages that are already installed are
# skipped. Needs root (or sudo).
set -euo pipefail

packages=(
  build-essential cmake pkg-config git ccache
  libboost-dev libssl-dev libsodium-dev libprotobuf-dev protobuf-compiler
  nlohmann-json3-dev libgtest-dev libgmock-dev libcli11-dev libspdlog-dev libfmt-dev
  libeigen3-dev zlib1g-dev
  libopenmpi-dev openmpi-bin libgloo-dev   # peers measured by `xsilo bench allreduce`
  python3-numpy                            # reference implementation in `xsilo bench robust`, the SDK
  python3-torch                            # the PyTorch example (examples/pytorch) and its tests
  chromium                                 # headless, draws report.html in tests/report_browser_test.cpp
  openssl
)
packages+=("$@")

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root (or install sudo)"; exit 1; }
  SUDO=sudo
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
