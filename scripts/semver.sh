#!/usr/bin/env bash
# CI: cargo-semver-checks on every library crate against the newest release tag `v*` (its
# API as built from that commit, `--baseline-rev`): a breaking change without the version bump
# that says so fails. Before the first release there is nothing to compare with: it says so
# and succeeds (.ci/run calls it only once a `v*` tag exists, so CI does not build the tool
# before then). Installs the pinned cargo-semver-checks with `cargo install --locked` into
# cargo's bin directory when that version is not there yet. Each cargo-semver-checks release
# reads the rustdoc JSON of the Rust releases of its time: when a new stable toolchain's format
# is not supported, raise VERSION. The crates excluded are the `publish = false` members, as
# in scripts/package.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.51.0
BASELINE=$(git tag -l 'v*' --sort=-v:refname | head -n 1)
if [[ -z $BASELINE ]]; then
  echo "semver: no release tag v* yet, nothing to compare with"
  exit 0
fi
if ! cargo install --list | grep -qx "cargo-semver-checks v$VERSION:"; then
  echo "semver.sh: installing cargo-semver-checks $VERSION" >&2
  cargo install --locked --version "$VERSION" cargo-semver-checks
fi
echo "semver.sh: library crates against $BASELINE ($(git rev-parse --short "$BASELINE^{commit}"))" >&2
cargo semver-checks --workspace --baseline-rev "$BASELINE" \
  --exclude tailguard-gateway \
  --exclude tailguard-test-support \
  --exclude tailguard-examples \
  --exclude tailguard-tests \
  --exclude tailguard-benches
