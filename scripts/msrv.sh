#!/usr/bin/env bash
# CI: builds every library and binary with the toolchain of the declared MSRV (`rust-version`
# in the root Cargo.toml's [workspace.package]), so the declaration cannot drift from what
# builds. "1.95" maps to rustup's toolchain "1.95.0"; a full "1.95.1" is used as it is. The
# toolchain is not installed here: where rustup does not have it, this fails and says how to
# get it. Tests, benches and examples are not built (dev-dependencies may need newer Rust).
set -euo pipefail
cd "$(dirname "$0")/.."
MSRV=$(sed -n '/^\[workspace\.package\]/,/^\[/ s/^rust-version *= *"\([^"]*\)".*/\1/p' Cargo.toml)
if ! [[ $MSRV =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]]; then
  echo "msrv.sh: no rust-version = \"X.Y\" in [workspace.package] of Cargo.toml (read: '$MSRV')" >&2
  exit 1
fi
TOOLCHAIN=$MSRV
[[ $TOOLCHAIN =~ ^[0-9]+\.[0-9]+$ ]] && TOOLCHAIN=$TOOLCHAIN.0
if ! command -v rustup >/dev/null; then
  echo "msrv.sh: rustup missing; cannot select toolchain $TOOLCHAIN for rust-version $MSRV" >&2
  exit 1
fi
if ! rustup toolchain list | grep -q "^$TOOLCHAIN-"; then
  echo "msrv.sh: toolchain $TOOLCHAIN (rust-version = \"$MSRV\") is not installed; installed:" >&2
  rustup toolchain list >&2
  echo "msrv.sh: install it with: rustup toolchain install $TOOLCHAIN --profile minimal" >&2
  exit 1
fi
echo "msrv.sh: rust-version $MSRV -> cargo +$TOOLCHAIN ($(rustc "+$TOOLCHAIN" --version))" >&2
cargo "+$TOOLCHAIN" check --workspace --lib --bins
