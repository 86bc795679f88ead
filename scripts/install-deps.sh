#!/usr/bin/env bash
# Debian 12 packages hyspec needs to build and test (run as root, or through sudo).
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  build-essential cmake ninja-build pkg-config ccache \
  libpcre2-dev nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libfmt-dev \
  libgtest-dev libgmock-dev libbenchmark-dev nodejs npm ca-certificates > /dev/null
