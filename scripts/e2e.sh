#!/usr/bin/env bash
# Client end-to-end tests of the gateway (tailguard-gateway): the official `openai` and `anthropic` Python
# SDKs (tests/python/), a `curl -N` smoke test and `promtool check metrics` on /metrics, against
# the gateway over embedded mock replicas, then a graceful shutdown. Bounded: every wait has a limit, and the
# gateway is killed on exit whatever happens. Set TAILGUARD_SKIP_CLIENT_TESTS=1 to skip.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ${TAILGUARD_SKIP_CLIENT_TESTS:-} == 1 ]]; then
  echo "e2e: skipped (TAILGUARD_SKIP_CLIENT_TESTS=1)"
  exit 0
fi
command -v curl >/dev/null || { echo "e2e: curl is required" >&2; exit 1; }

export PYTHONDONTWRITEBYTECODE=1
PY=$(./scripts/python-venv.sh)
cargo build --quiet -p tailguard-gateway --bin tailguard-gateway
GATEWAY_BIN=${CARGO_TARGET_DIR:-target}/debug/tailguard-gateway

WORK=$(mktemp -d)
LOG=$WORK/gateway.log
GW_PID=
cleanup() {
  if [[ -n $GW_PID ]] && kill -0 "$GW_PID" 2>/dev/null; then
    kill -KILL "$GW_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() {
  echo "e2e: $*" >&2
  echo "---- gateway log" >&2
  cat "$LOG" >&2 || true
  exit 1
}

echo "== invalid configuration: a clear error naming the key, non-zero exit"
printf '[timeout]\nidel = "5s"\n' >"$WORK/bad.toml"
set +e
"$GATEWAY_BIN" --listen 127.0.0.1:0 --config "$WORK/bad.toml" </dev/null >"$WORK/bad.out" 2>&1
RC=$?
set -e
[[ $RC -eq 2 ]] || fail "bad config: exit code $RC, want 2"
grep -q 'unknown field `idel`' "$WORK/bad.out" || fail "bad config: unexpected message: $(cat "$WORK/bad.out")"

# Port 0: the gateway picks a free port and prints it.
"$GATEWAY_BIN" --listen 127.0.0.1:0 --config tests/python/gateway.toml </dev/null >"$LOG" 2>&1 &
GW_PID=$!

ADDR=
for _ in $(seq 1 300); do
  ADDR=$(sed -n 's|^tailguard gateway listening on http://||p' "$LOG" | head -n1)
  [[ -n $ADDR ]] && break
  kill -0 "$GW_PID" 2>/dev/null || fail "the gateway exited before it was ready"
  sleep 0.1
done
[[ -n $ADDR ]] || fail "the gateway did not print its address within 30s"
URL=http://$ADDR
for _ in $(seq 1 100); do
  curl -fsS --max-time 2 "$URL/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fsS --max-time 2 "$URL/healthz" >/dev/null || fail "/healthz is not answering"
UPSTREAM=$(sed -n 's|^  upstream 0: \(http://[0-9.:]*\).*|\1|p' "$LOG" | head -n1)
[[ -n $UPSTREAM ]] || fail "no upstream address in the gateway's output"

echo "== openai and anthropic SDK end-to-end tests (gateway $URL)"
TAILGUARD_GATEWAY_URL=$URL TAILGUARD_UPSTREAM_URL=$UPSTREAM \
  timeout 300 "$PY" -m pytest -q -p no:cacheprovider tests/python </dev/null \
  || fail "the SDK tests failed"

echo "== curl -N smoke test"
OUT=$WORK/curl.out
curl -sS -N --fail --max-time 10 "$URL/v1/chat/completions" \
  -H 'content-type: application/json' \
  -H 'x-mock-script: ttft=10ms,tokens=8,gap=2ms' \
  -d '{"model":"mock-llm","stream":true,"messages":[{"role":"user","content":"Hello!"}]}' \
  >"$OUT" || fail "curl -N failed"
grep -q '"content":"' "$OUT" || fail "curl: no content chunk in: $(cat "$OUT")"
[[ $(tail -n 2 "$OUT" | head -n 1) == "data: [DONE]" ]] || fail "curl: the stream did not end with [DONE]: $(cat "$OUT")"
curl -fsS --max-time 5 "$URL/metrics" >"$WORK/metrics.txt" || fail "GET /metrics failed"
grep -q '^tailguard_time_to_first_token_seconds_bucket{' "$WORK/metrics.txt" \
  || fail "/metrics has no time-to-first-token histogram"

echo "== promtool check metrics: /metrics with every family the tests touched, no warning"
PROMTOOL=$(./scripts/promtool.sh) || PROMTOOL=
if [[ -n $PROMTOOL ]]; then
  "$PROMTOOL" check metrics <"$WORK/metrics.txt" >"$WORK/promtool.out" 2>&1 \
    || fail "promtool check metrics: $(cat "$WORK/promtool.out")"
  [[ ! -s $WORK/promtool.out ]] || fail "promtool check metrics warned: $(cat "$WORK/promtool.out")"
else
  echo "e2e: SKIPPED promtool check metrics: promtool is not installed and could not be" \
    "installed from Debian's prometheus package (apt-get download needs apt and its lists)"
fi

echo "== graceful shutdown: an in-flight stream runs on for the grace period (2s), then ends in-band"
STREAM=$WORK/stream.out
curl -sS -N --max-time 20 "$URL/v1/chat/completions" \
  -H 'content-type: application/json' \
  -H 'x-mock-script: ttft=10ms,tokens=1000,gap=50ms' \
  -d '{"model":"mock-llm","stream":true,"messages":[{"role":"user","content":"Hello!"}]}' \
  >"$STREAM" 2>&1 &
CURL_PID=$!
for _ in $(seq 1 100); do
  grep -q '"content":"' "$STREAM" && break
  sleep 0.05
done
grep -q '"content":"' "$STREAM" || fail "the in-flight stream did not start: $(cat "$STREAM")"
kill -TERM "$GW_PID"
wait "$CURL_PID" || fail "curl failed during the shutdown: $(tail -n 3 "$STREAM")"
grep -q '"code":"shutdown"' "$STREAM" || fail "the stream did not end with the shutdown event: $(tail -n 3 "$STREAM")"
[[ $(tail -n 2 "$STREAM" | head -n 1) == "data: [DONE]" ]] || fail "the stream did not end with [DONE]"
for _ in $(seq 1 100); do
  kill -0 "$GW_PID" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$GW_PID" 2>/dev/null; then fail "the gateway did not stop within 10s of SIGTERM"; fi
wait "$GW_PID" || fail "the gateway exited with an error after SIGTERM"
GW_PID=
echo "e2e ok"
