#!/usr/bin/env bash
# Installs nginx for the gateway-vs-nginx bench (benches/src/bin/gateway_nginx/): Debian's
# `nginx-light` through apt-get, when no nginx is installed. Prints the nginx binary's path on
# stdout. The package's service is not started (the bench runs its own nginx on 127.0.0.1 with a
# configuration of its own). Exits non-zero with a message on stderr where nginx cannot be had
# (no apt-get, not root and no sudo, the package not found).
set -euo pipefail

find_nginx() {
  command -v nginx 2>/dev/null || { [[ -x /usr/sbin/nginx ]] && echo /usr/sbin/nginx; }
}

if bin=$(find_nginx); then
  echo "$bin"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install-nginx: nginx is not installed and there is no apt-get here: install nginx yourself" >&2
  exit 1
fi
SUDO=
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    SUDO=sudo
  else
    echo "install-nginx: nginx is not installed; installing it needs root (run: sudo apt-get install nginx-light)" >&2
    exit 1
  fi
fi

# Keep the package's init script from starting a system nginx on port 80 (the policy-rc.d
# convention: exit 101 = "action forbidden"), unless a policy is already in place.
POLICY=/usr/sbin/policy-rc.d
if [[ ! -e $POLICY ]]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
  $SUDO chmod +x "$POLICY"
  trap '$SUDO rm -f "$POLICY"' EXIT
fi

export DEBIAN_FRONTEND=noninteractive
if ! apt-cache show nginx-light >/dev/null 2>&1; then
  echo "install-nginx: updating the package lists" >&2
  $SUDO apt-get update -qq >&2
fi
if ! apt-cache show nginx-light >/dev/null 2>&1; then
  echo "install-nginx: this distribution has no nginx-light package: install nginx yourself" >&2
  exit 1
fi
echo "install-nginx: apt-get install nginx-light" >&2
$SUDO apt-get install -y -qq --no-install-recommends nginx-light >&2

if bin=$(find_nginx); then
  echo "$bin"
else
  echo "install-nginx: nginx-light installed but no nginx binary found" >&2
  exit 1
fi
