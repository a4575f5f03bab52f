# The server a bench script starts and stops: a free-ish port on 127.0.0.1, and stop_server,
# run on exit too. Sourced by benches/e2e.sh, durable_ingest.sh and sync_latency.sh, which set
# SERVER_PID when they start one.
PORT=$((20000 + RANDOM % 20000))
URL="http://127.0.0.1:$PORT"
SERVER_PID=""
stop_server() {
  if [[ -n "$SERVER_PID" ]]; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
  fi
}
trap stop_server EXIT
