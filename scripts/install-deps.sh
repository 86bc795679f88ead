#!/usr/bin/env bash
# Debian 12 packages hyspec needs to build and test (run as root, or through sudo).
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
# Node.js + npm run the openai-client end-to-end test; a machine that already has them (e.g. from
# NodeSource, which conflicts with Debian's npm) keeps its own.
NODE_PKGS=""
command -v node > /dev/null && command -v npm > /dev/null || NODE_PKGS="nodejs npm"
$SUDO apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  build-essential cmake ninja-build pkg-config ccache ca-certificates \
  libpcre2-dev nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libfmt-dev \
  libgtest-dev libgmock-dev libbenchmark-dev $NODE_PKGS > /dev/null
