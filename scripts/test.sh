#!/usr/bin/env bash
# Runs the whole test suite: every crate's unit, integration and doc tests.
# Anything the tests need is installed by this script; nothing is installed by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --all-features
