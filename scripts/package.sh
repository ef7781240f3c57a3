#!/usr/bin/env bash
# CI: `cargo package` for every library crate, as `cargo publish` would pack them: each .crate
# is built on its own (the verify step, `cargo build` of the unpacked crate, with all its
# features), the workspace's unpublished local dependencies taken from a temporary registry of
# the crates packaged alongside. Tests are not built: their path-only dev-dependency
# `tailguard-test-support` is stripped from the packaged manifests. The crates excluded here
# are the members with `publish = false`; keep the list in step with them.
# `--allow-dirty`: what is checked is that the crates pack and build, not that the tree is
# committed (`cargo publish` itself still refuses a dirty tree).
set -euo pipefail
cd "$(dirname "$0")/.."
# Every run packs the same versions (0.1.0) with new contents, and two caches would hand the
# verify step an earlier run's crates (cargo 1.95): cargo unpacks the crates of its temporary
# registry (target/package/tmp-registry) into $CARGO_HOME/registry/src/-<hash>/ (local
# registries: no host before the dash) once per name and version, and it never rebuilds a
# registry crate it has built (registry sources are taken as immutable: no dep-info). So drop
# our unpacked copies, and the build units of tailguard crates built from them (their dep-info
# names registry/src/-*; the workspace's own units, built from crates/, are left alone).
for dir in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/; do
  rm -rf "$dir"tailguard-[0-9]* "$dir"tailguard-*-[0-9]*
done
BUILD_DIR=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"build_directory":"\([^"]*\)".*/\1/p')
BUILD_DIR=${BUILD_DIR:-target}
for dep_info in "$BUILD_DIR"/debug/deps/tailguard*.d; do
  [[ -f $dep_info ]] || continue
  grep -q '/registry/src/-[^/]*/tailguard' "$dep_info" || continue
  hash=$(basename "$dep_info" .d)
  hash=${hash##*-}
  rm -rf "$BUILD_DIR"/debug/.fingerprint/tailguard*-"$hash" "$dep_info"
done
cargo package --workspace --all-features --allow-dirty \
  --exclude tailguard-gateway \
  --exclude tailguard-test-support \
  --exclude tailguard-examples \
  --exclude tailguard-tests \
  --exclude tailguard-benches
