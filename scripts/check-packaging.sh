#!/usr/bin/env bash
# Checks the Docker / Compose / Prometheus / Grafana packaging as far as a machine without a Docker
# engine can (see docs/packaging.md for what it cannot check).
#
#   scripts/check-packaging.sh [BINARY]     BINARY: a built geodwell (default: cargo build --release)
#   CHECK_PACKAGING_NO_CONTEXT_BUILD=1 ...  skip compiling the Docker build context (about a minute)
#
# 1. tools: promtool (Debian's `prometheus` package, installed when missing), PyYAML
# 2. promtool check config config/prometheus.yml
# 3. Dockerfile, docker-compose.yml, .dockerignore, Grafana provisioning: structure and mounts
#    (scripts/packaging_lint.py check)
# 4. the Docker build context (repository filtered by .dockerignore) compiles: cargo check --locked
# 5. the container's GEODWELL_* environment (Dockerfile + compose) passes `geodwell check-config`
# 6. server 1 on a free 127.0.0.1 port (temporary data dir, removed on exit) is fed fences, fixes
#    and subscribers so that every metric exists; then on its /metrics: promtool check metrics,
#    and scripts/check_dashboard.py (every metric and label the dashboard queries is exported),
#    plus a negative test that the dashboard check does fail; SIGTERM stops it with exit 0
# 7. server 2 runs with the compose service's environment: the Dockerfile's HEALTHCHECK command
#    passes against it and fails against a closed port
# 8. the compose demo simulator's command line runs (3 s) against server 2
# 9. SIGTERM (what `docker stop` sends) stops server 2 with exit 0
# Exits non-zero if any check failed; the server is stopped and temporary files removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

WORK=$(mktemp -d "${TMPDIR:-/tmp}/geodwell-packaging.XXXXXX")
SERVER_PID=""
cleanup() {
  if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

PASSED=0
FAILED=0
FAILURES=()
START_ALL=$SECONDS

# check NAME CMD...: runs CMD, prints its output indented, PASS/FAIL and the time it took.
check() {
  local name=$1 t0=$SECONDS rc=0
  shift
  echo "-- $name"
  "$@" >"$WORK/out" 2>&1 || rc=$?
  sed 's/^/   /' "$WORK/out"
  if [[ $rc == 0 ]]; then
    PASSED=$((PASSED + 1))
    echo "   PASS ($((SECONDS - t0)) s)"
  else
    FAILED=$((FAILED + 1))
    FAILURES+=("$name")
    echo "   FAIL (exit $rc, $((SECONDS - t0)) s)"
  fi
}

die() {
  echo "check-packaging: $*" >&2
  exit 1
}

echo "== packaging checks"

# --- 1. tools -------------------------------------------------------------------------------
if ! command -v promtool >/dev/null; then
  echo "-- installing Debian's prometheus package for promtool"
  t0=$SECONDS
  # Keep the package's init script from starting a Prometheus server during the install.
  created_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    created_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  install_rc=0
  { apt-get install -y -q --no-install-recommends prometheus >"$WORK/apt.log" 2>&1 ||
    { apt-get update -q >>"$WORK/apt.log" 2>&1 &&
      apt-get install -y -q --no-install-recommends prometheus >>"$WORK/apt.log" 2>&1; }; } || install_rc=$?
  if [[ $created_policy == 1 ]]; then rm -f /usr/sbin/policy-rc.d; fi
  if [[ $install_rc != 0 ]]; then
    tail -20 "$WORK/apt.log" >&2
    die "apt-get install prometheus failed"
  fi
  echo "   installed in $((SECONDS - t0)) s"
fi
echo "-- promtool: $(promtool --version 2>&1 | head -1)"
if ! python3 -c 'import yaml' 2>/dev/null; then
  echo "-- installing PyYAML"
  python3 -m pip install --quiet pyyaml || die "pip install pyyaml failed"
fi

# --- 2.-3. static checks --------------------------------------------------------------------
check "promtool check config config/prometheus.yml" promtool check config config/prometheus.yml
check "Dockerfile, docker-compose.yml, .dockerignore, Grafana provisioning" \
  python3 scripts/packaging_lint.py check

# Information only: the image compiles with its own toolchain, pinned in the Dockerfile.
dockerfile_rust=$(sed -n 's/^ARG RUST_VERSION=//p' Dockerfile)
machine_rust=$(rustc --version 2>/dev/null | awk '{print $2}' | cut -d. -f1,2 || true)
if [[ -n "$machine_rust" && "$dockerfile_rust" != "$machine_rust" ]]; then
  echo "-- note: the Dockerfile builds with Rust $dockerfile_rust, this machine has $machine_rust (update ARG RUST_VERSION)"
fi

# --- 4. the Docker build context compiles ---------------------------------------------------
context_build() {
  python3 scripts/packaging_lint.py context "$WORK/context" &&
    # Same target dir as the repository: dependencies are reused, only geodwell is checked.
    (cd "$WORK/context" && CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}" \
      cargo check --locked --quiet --bin geodwell)
}
if [[ "${CHECK_PACKAGING_NO_CONTEXT_BUILD:-0}" == 1 ]]; then
  echo "-- Docker build context compiles: skipped (CHECK_PACKAGING_NO_CONTEXT_BUILD=1)"
else
  check "Docker build context (.dockerignore applied) compiles: cargo check --locked" context_build
fi

# --- the binary -----------------------------------------------------------------------------
if [[ $# -ge 1 ]]; then
  BIN=$(realpath "$1")
else
  echo "-- cargo build --release --bin geodwell"
  cargo build --release --quiet --bin geodwell
  BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/geodwell"
fi
[[ -x "$BIN" ]] || die "no geodwell binary at $BIN"
echo "-- binary: $BIN ($("$BIN" --version))"

# The checks below set their own GEODWELL_* variables; inherited ones would change the results
# (and unknown ones are startup errors).
while read -r var; do unset "$var"; done < <(compgen -e | grep '^GEODWELL_' || true)

# --- 5. the container's configuration is valid ----------------------------------------------
check_container_config() {
  local env_lines
  env_lines=$(python3 scripts/packaging_lint.py env "$@") || return 1
  echo "$env_lines"
  # The container runs `serve` without --config: embedded defaults + environment. check-config
  # of an empty file loads exactly that (fences file included) and reports every error.
  : >"$WORK/empty.toml"
  local vars
  mapfile -t vars <<<"$env_lines"
  env "${vars[@]}" "$BIN" check-config "$WORK/empty.toml"
}
check "image environment (Dockerfile ENV) passes geodwell check-config" check_container_config --image-only
check "compose environment (Dockerfile ENV + compose, mounts mapped) passes geodwell check-config" \
  check_container_config

# --- 6.-9. live servers ---------------------------------------------------------------------
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# start_server NAME VAR=VALUE...: starts `geodwell serve` with that environment on a free loopback
# port and a fresh data dir under $WORK; sets SERVER_PID, PORT and URL.
start_server() {
  local name=$1 port
  shift
  for _ in 1 2 3; do
    port=$(free_port)
    rm -rf "$WORK/data-$name"
    env "$@" GEODWELL_LISTEN="127.0.0.1:$port" GEODWELL_DATA_DIR="$WORK/data-$name" \
      "$BIN" serve >"$WORK/server-$name.log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 1 100); do
      if curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1; then
        PORT=$port
        URL="http://127.0.0.1:$port"
        echo "-- server $name: $URL (pid $SERVER_PID)"
        return 0
      fi
      kill -0 "$SERVER_PID" 2>/dev/null || break
      sleep 0.1
    done
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
  done
  echo "server $name did not become ready; its log:" >&2
  cat "$WORK/server-$name.log" >&2
  return 1
}

# SIGTERM, as `docker stop` sends: the server must drain and exit 0.
graceful_stop() {
  local name=$1 rc=0
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID" || rc=$?
  SERVER_PID=""
  echo "server exit code after SIGTERM: $rc"
  if [[ $rc != 0 ]]; then tail -20 "$WORK/server-$name.log"; fi
  [[ $rc == 0 ]]
}

PORT=""
URL=""

# Server 1: every metric. Event clock (fixed timestamps), lateness 5 s (so fixes can be late and
# duplicate), a sync store in a temporary dir (store metrics), subscriber_queue 1 (a subscriber
# can be made to lag).
start_server metrics GEODWELL_DURABILITY=sync GEODWELL_FENCES_FILE= GEODWELL_CLOCK=event \
  GEODWELL_LATENESS=5s GEODWELL_SHARDS=2 GEODWELL_SUBSCRIBER_QUEUE=1 GEODWELL_LOG=warn ||
  die "cannot start $BIN"
if check "feed the server (fence, fixes, late/duplicate/rejected, subscribers) and scrape /metrics" \
  python3 scripts/packaging_lint.py feed "$URL" "$WORK/metrics.txt"; then
  promtool_check_metrics() { promtool check metrics <"$WORK/metrics.txt"; }
  check "promtool check metrics on the live /metrics" promtool_check_metrics
  check "dashboard queries only exported metrics and labels (scripts/check_dashboard.py)" \
    python3 scripts/check_dashboard.py --metrics "$WORK/metrics.txt" \
    --dashboard config/grafana/dashboards/geodwell.json \
    --datasources config/grafana/provisioning/datasources \
    --prometheus-config config/prometheus.yml --telemetry src/telemetry.rs \
    --rules-out "$WORK/dashboard-rules.json"
  check "dashboard PromQL parses (promtool check rules)" promtool check rules "$WORK/dashboard-rules.json"
  # The dashboard check must be able to fail: a misspelt counter, a histogram queried by its bare
  # name, `_count` on a counter, an unknown grouping label and an unprovisioned datasource.
  cat >"$WORK/bad-dashboard.json" <<'EOF'
{"title": "bad", "panels": [{"title": "p", "datasource": {"type": "prometheus", "uid": "nope"}, "targets": [
  {"refId": "A", "expr": "rate(geodwell_fixes_recieved_total[1m])"},
  {"refId": "B", "expr": "histogram_quantile(0.9, rate(geodwell_wheel_tick_duration_seconds[1m]))"},
  {"refId": "C", "expr": "rate(geodwell_fixes_late_count[1m])"},
  {"refId": "D", "expr": "sum by (shrad) (geodwell_wheel_carry)"}]}]}
EOF
  bad_dashboard_fails() {
    local rc=0
    python3 scripts/check_dashboard.py --metrics "$WORK/metrics.txt" --dashboard "$WORK/bad-dashboard.json" \
      --datasources config/grafana/provisioning/datasources >"$WORK/bad.out" 2>&1 || rc=$?
    echo "(expected to fail)"
    cat "$WORK/bad.out"
    [[ $rc == 1 ]] && [[ $(grep -c '^  - ' "$WORK/bad.out") == 5 ]]
  }
  check "the dashboard check rejects a broken dashboard (5 planted problems)" bad_dashboard_fails
fi
check "SIGTERM stops the metrics server cleanly" graceful_stop metrics

# Server 2: configured as the compose service (Dockerfile ENV + compose environment, the fences
# file through its bind mount); only the listen address and data dir are moved to this machine.
mapfile -t CONTAINER_ENV < <(python3 scripts/packaging_lint.py env | grep -v -e '^GEODWELL_LISTEN=' -e '^GEODWELL_DATA_DIR=')
start_server container "${CONTAINER_ENV[@]}" || die "cannot start $BIN with the compose environment"

HEALTHCHECK_CMD=$(python3 scripts/packaging_lint.py healthcheck)
healthcheck_passes() { echo "\$ $HEALTHCHECK_CMD"; GEODWELL_LISTEN="0.0.0.0:$PORT" sh -c "$HEALTHCHECK_CMD"; }
healthcheck_fails_when_down() {
  local closed rc=0
  closed=$(free_port)
  GEODWELL_LISTEN="0.0.0.0:$closed" sh -c "$HEALTHCHECK_CMD" || rc=$?
  echo "exit $rc against closed port $closed"
  [[ $rc != 0 ]]
}
check "Dockerfile HEALTHCHECK command passes against the compose-configured server" healthcheck_passes
check "Dockerfile HEALTHCHECK command fails against a closed port" healthcheck_fails_when_down

demo_runs() {
  local args
  mapfile -t args < <(python3 scripts/packaging_lint.py demo-command "$URL" 3s)
  if [[ ${#args[@]} == 0 ]]; then
    echo "no simulator service"
    return 0
  fi
  echo "\$ geodwell ${args[*]}"
  timeout 120 "$BIN" "${args[@]}"
}
check "compose demo simulator command runs (3 s) against the compose-configured server" demo_runs
check "SIGTERM stops the compose-configured server cleanly" graceful_stop container

echo "== packaging: $PASSED passed, $FAILED failed ($((SECONDS - START_ALL)) s)"
if [[ $FAILED != 0 ]]; then
  printf '   failed: %s\n' "${FAILURES[@]}"
  exit 1
fi
