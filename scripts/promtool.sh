#!/usr/bin/env bash
# Prints the path of a `promtool` for the e2e suite's `promtool check metrics`: the one on
# PATH, else one unpacked from Debian's `prometheus` package into .venv/bin (git-ignored; no
# root needed, no service installed or started: the package is only unpacked, never
# installed). Fails, printing nothing, where neither is possible (no apt, no package lists).
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v promtool >/dev/null; then
  command -v promtool
  exit 0
fi
LOCAL=$PWD/.venv/bin/promtool
if [[ -x $LOCAL ]]; then
  echo "$LOCAL"
  exit 0
fi
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || exit 1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
(cd "$TMP" && apt-get download -qq prometheus) >&2 || exit 1
dpkg-deb -x "$TMP"/prometheus_*.deb "$TMP/x"
mkdir -p "$(dirname "$LOCAL")"
cp "$TMP/x/usr/bin/promtool" "$LOCAL"
"$LOCAL" --version >/dev/null 2>&1 || { rm -f "$LOCAL"; exit 1; }
echo "$LOCAL"
