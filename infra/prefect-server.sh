#!/usr/bin/env bash
# A real, long-lived local Prefect server: the compose-free way to run Conductor's deployments.
#
#   bash infra/prefect-server.sh start [DIR] [PORT]   # start (or find running) server; prints the API URL
#   bash infra/prefect-server.sh stop  [DIR]          # stop it (no-op when not running)
#   bash infra/prefect-server.sh status [DIR]         # exit 0 and print the URL when healthy, 1 otherwise
#   bash infra/prefect-server.sh url   [DIR]          # print the API URL of the running server
#
# DIR (default: $CONDUCTOR_HOME/prefect-server or ~/.cache/conductor/prefect-server) holds everything the
# server owns: its PREFECT_HOME, its SQLite database (prefect.db), server.log, server.pid and api-url.
# PORT defaults to 4200; "auto" picks a free loopback port. The server binds 127.0.0.1 only.
# Idempotent: "start" on a healthy server just prints its URL; "stop" on a stopped one does nothing.
# Then point clients at it:  export PREFECT_API_URL=$(bash infra/prefect-server.sh url DIR)
set -euo pipefail

cmd=${1:-}
dir=${2:-${CONDUCTOR_HOME:-$HOME/.cache/conductor}/prefect-server}
port=${3:-4200}
timeout_s=${PREFECT_SERVER_START_TIMEOUT:-120}
py=${PYTHON:-python}

die() { echo "error: $*" >&2; exit 2; }

healthy() {  # $1 = API URL
    curl -fsS --max-time 2 "$1/health" >/dev/null 2>&1
}

running_pid() {  # prints the pid when the recorded server process is alive
    [[ -f "$dir/server.pid" ]] || return 1
    local pid
    pid=$(cat "$dir/server.pid")
    [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

current_url() {
    [[ -f "$dir/api-url" ]] && cat "$dir/api-url"
}

start() {
    mkdir -p "$dir/home"
    dir=$(cd "$dir" && pwd)
    local url
    if running_pid >/dev/null && url=$(current_url) && healthy "$url"; then
        echo "$url"
        return 0
    fi
    if pid=$(running_pid); then  # alive but not healthy: a half-started server from an earlier call
        stop_quiet
    fi
    if [[ "$port" == auto ]]; then
        port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    fi
    [[ "$port" =~ ^[0-9]+$ ]] || die "port must be a number or 'auto', got '$port'"
    url="http://127.0.0.1:$port/api"
    if healthy "$url"; then
        die "port $port already serves a Prefect API that this script did not start (use another port)"
    fi
    # Own session (setsid) so that stop can end the server and its uvicorn/service children as one group.
    PREFECT_HOME="$dir/home" \
    PREFECT_API_DATABASE_CONNECTION_URL="sqlite+aiosqlite:///$dir/prefect.db" \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    PREFECT_SERVER_API_HOST=127.0.0.1 \
    PREFECT_SERVER_API_PORT="$port" \
    PREFECT_API_URL= \
        setsid "$py" -m prefect server start --host 127.0.0.1 --port "$port" --analytics-off \
        >"$dir/server.log" 2>&1 </dev/null &
    echo $! >"$dir/server.pid"
    echo "$url" >"$dir/api-url"
    local waited=0
    until healthy "$url"; do
        if ! running_pid >/dev/null; then
            tail -n 20 "$dir/server.log" >&2 || true
            die "Prefect server exited during start-up; see $dir/server.log"
        fi
        if (( waited >= timeout_s * 4 )); then
            stop_quiet
            die "Prefect server not healthy at $url after ${timeout_s}s; see $dir/server.log"
        fi
        sleep 0.25
        waited=$((waited + 1))
    done
    echo "$url"
}

stop_quiet() {
    local pid
    if pid=$(running_pid); then
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 60); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.25
        done
        kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    rm -f "$dir/server.pid"
}

case "$cmd" in
    start) start ;;
    stop) stop_quiet ;;
    status)
        if running_pid >/dev/null && url=$(current_url) && healthy "$url"; then echo "$url"; else exit 1; fi ;;
    url)
        url=$(current_url) || die "no server recorded under $dir (run: $0 start $dir)"
        echo "$url" ;;
    *) die "usage: $0 start|stop|status|url [DIR] [PORT|auto]" ;;
esac
