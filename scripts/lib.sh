# Sourced by scripts/browser-test.sh and scripts/schemathesis.sh: run a geodwell server on a port
# the kernel picks, and stop it.

# geodwell_start LOG COMMAND...: runs COMMAND (a `geodwell serve --listen 127.0.0.1:0 ...`, with
# any environment) in the background, its output in LOG; sets SERVER_PID, and PORT once the log
# says where it listens. Exits 1, printing the log, if the server does not start.
geodwell_start() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  SERVER_PID=$!
  PORT=""
  for _ in $(seq 1 100); do
    PORT=$(sed -n 's/.*geodwell listening.*addr=127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' "$log" | head -n1)
    [[ -n "$PORT" ]] && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "$(basename "$0"): the server did not start; its log:" >&2
  cat "$log" >&2
  exit 1
}

# geodwell_stop: stops the server geodwell_start started, if it runs.
geodwell_stop() {
  if [[ -n "${SERVER_PID:-}" ]]; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
  fi
}
