#!/usr/bin/env bash
# Starts a private redis-server for the Redis tests and exports its URL as TAILGUARD_REDIS_URL.
# Source it (`. scripts/redis.sh`) from a script: the server runs on a free 127.0.0.1 port, in
# its own directory, with persistence off, and is killed when the sourcing shell exits.
# Installs Debian's redis-server when it is missing; if it cannot be had or does not start, it
# fails (the sourcing script exits): the cluster tests never pass by not running.

tailguard_redis_start() {
    if ! command -v redis-server >/dev/null 2>&1; then
        echo "redis.sh: redis-server missing, installing Debian's redis-server" >&2
        if command -v apt-get >/dev/null 2>&1; then
            { apt-get install -y redis-server || { apt-get update && apt-get install -y redis-server; }; } \
                >/dev/null 2>&1 || true
        fi
    fi
    if ! command -v redis-server >/dev/null 2>&1; then
        echo "redis.sh: redis-server cannot be installed here; the Redis tests cannot run" >&2
        return 1
    fi
    local dir port
    dir="$(mktemp -d -t tailguard-redis.XXXXXX)"
    port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null \
        || echo $((20000 + RANDOM % 20000)))"
    redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no --dir "$dir" \
        --daemonize no --logfile "$dir/redis.log" &
    TAILGUARD_REDIS_PID=$!
    TAILGUARD_REDIS_DIR="$dir"
    trap 'kill "$TAILGUARD_REDIS_PID" 2>/dev/null; wait "$TAILGUARD_REDIS_PID" 2>/dev/null; rm -rf "$TAILGUARD_REDIS_DIR"' EXIT
    for _ in $(seq 1 100); do
        if redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1; then
            export TAILGUARD_REDIS_URL="redis://127.0.0.1:$port/"
            # The tests restart the server through these (same port, same directory).
            export TAILGUARD_REDIS_PORT="$port" TAILGUARD_REDIS_DIR
            echo "redis.sh: redis-server on $TAILGUARD_REDIS_URL (pid $TAILGUARD_REDIS_PID)" >&2
            return 0
        fi
        sleep 0.05
    done
    echo "redis.sh: redis-server did not start (see $dir/redis.log); the Redis tests cannot run" >&2
    return 1
}

tailguard_redis_start || exit 1
