#!/usr/bin/env bash
# Runs the whole test suite: every crate's unit, integration and doc tests, then the client
# end-to-end tests of the gateway (the official `openai` Python SDK and `curl -N`,
# scripts/e2e.sh, which creates its own Python venv in .venv).
# Anything the tests need is installed by this script; nothing is installed by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
# A private redis-server for the cluster-mode tests (tailguard-redis); killed on exit.
. scripts/redis.sh
# Builds the gateway binary too: crates/gateway/tests/cluster.rs runs it as separate processes
# against that server (and restarts a redis-server of its own).
cargo test --workspace --all-features
./scripts/e2e.sh
