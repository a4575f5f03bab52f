#!/usr/bin/env bash
# Browser test of the live map page (docs/ui.md): starts geodwell on a free loopback port and
# runs tests/browser/map.mjs, which drives Debian's headless Chromium through playwright-core.
#
#   scripts/browser-test.sh                 build with `cargo build` and use target/debug/geodwell
#   scripts/browser-test.sh path/to/geodwell
#
# Needs node >= 20 and npm. Installs Debian's `chromium` with apt-get when /usr/bin/chromium is
# missing and we are root (CI); otherwise says how. Runs the page twice: without API keys, then
# with keys on (the page given a read-only key through ?key=). Outputs in target/browser/: map.png
# and map-auth.png (the screenshots: fences and the selected device's track), map-region.png and
# map-auth-region.png (zoomed out: the offline base layer's coast and borders, the fence's
# occupancy panel), server-*.log, and map*-failed.png when a check fails. The server is always
# stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT="$ROOT/target/browser"
mkdir -p "$OUT"
rm -f "$OUT"/map*.png "$OUT"/server*.log

CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
if [[ ! -x "$CHROMIUM" ]]; then
  if [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "== installing Debian's chromium (not found at $CHROMIUM)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "browser-test: $CHROMIUM is missing; install it (sudo apt-get install chromium) or set CHROMIUM=" >&2
    exit 1
  fi
fi
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "browser-test: $tool is required (node >= 20)" >&2; exit 1; }
done

echo "== npm ci (tests/browser: playwright-core, pinned by package-lock.json)"
(cd tests/browser && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)

if [[ $# -ge 1 ]]; then
  BIN=$(realpath "$1")
else
  echo "== cargo build"
  cargo build --quiet --bin geodwell
  BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug/geodwell"
fi
[[ -x "$BIN" ]] || { echo "browser-test: no executable at $BIN" >&2; exit 1; }

# shellcheck source=scripts/lib.sh
source scripts/lib.sh
DATA=$(mktemp -d)
cleanup() {
  geodwell_stop
  rm -rf "$DATA"
}
trap cleanup EXIT

# run_scenario NAME [VAR=value...]: a fresh server (with the extra environment) and one run of
# map.mjs against it (with the same environment). The script's keys are BROWSER_TEST_*_KEY: a
# GEODWELL_ prefix would make the server refuse them as unknown config overrides.
#
# Event clock with lateness 0: fixes apply on arrival and dwell deadlines follow their timestamps,
# so the test can send a few minutes of driving at once. No store, no preloaded fences: the test
# starts from an empty map. Port 0: the kernel picks a free port; the log says which.
run_scenario() {
  local name=$1
  shift
  local log="$OUT/server-$name.log"
  echo "== [$name] starting $BIN"
  rm -rf "$DATA/$name"
  geodwell_start "$log" env "$@" GEODWELL_DURABILITY=none GEODWELL_FENCES_FILE="" GEODWELL_LOG=info \
    "$BIN" serve --clock event --lateness 0s --listen 127.0.0.1:0 --data-dir "$DATA/$name"
  local port=$PORT
  local shot="$OUT/map-$name.png"
  [[ "$name" == open ]] && shot="$OUT/map.png"
  echo "== [$name] server on 127.0.0.1:$port; running tests/browser/map.mjs"
  env "$@" GEODWELL_URL="http://127.0.0.1:$port" CHROMIUM="$CHROMIUM" SCREENSHOT="$shot" \
    node tests/browser/map.mjs
  geodwell_stop
}

# 1. The default: no API keys.
run_scenario open
test -s "$OUT/map.png" && test -s "$OUT/map-region.png"
# 2. API keys on: the page with a read-only key (in ?key=), the script's API calls with an admin
#    key. Fresh random keys: nothing here is a real secret.
ADMIN_KEY="admin-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
PAGE_KEY="page-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
run_scenario auth GEODWELL_API_KEYS="browser-test:admin:$ADMIN_KEY,map-page:read:$PAGE_KEY" \
  BROWSER_TEST_ADMIN_KEY="$ADMIN_KEY" BROWSER_TEST_PAGE_KEY="$PAGE_KEY"
test -s "$OUT/map-auth.png" && test -s "$OUT/map-auth-region.png"
echo "== browser test ok: $OUT/map.png, $OUT/map-region.png, $OUT/map-auth.png, $OUT/map-auth-region.png"
