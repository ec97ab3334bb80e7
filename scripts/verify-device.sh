#!/usr/bin/env bash
# make verify-device: the whole path against a real llama-server router (design section 6).
#
# Builds the workspace, starts inferproxy against $UPSTREAM, runs `loopd selftest`, then the
# ignored tests in crates/loopd/tests/device.rs (a capped thinking block; a stream that survives
# its inferproxy being killed and restarted). They use slot 0 and never touch the llama-server
# process. Everything started here is stopped at the end, also on failure or Ctrl-C.
#
#   UPSTREAM   host:port of the router (default straylight:11434)
#   MODEL      model id on that router (required unless LOOPD_CONFIG is given)
#   LOOPD_CONFIG  a loopd config.toml whose [expect] describes that router; its socket is replaced
#                 by this script's own. Without it: EXPECT_SHA256, N_CTX and SLOTS build [expect].
#
# `make verify-device UPSTREAM=host:port MODEL=id EXPECT_SHA256=… N_CTX=… SLOTS=…`, or
# `make verify-device LOOPD_CONFIG=/etc/boxmaker/loopd.toml`. `make test` runs it against the
# local router through scripts/local-stack.sh verify.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
UPSTREAM=${UPSTREAM:-straylight:11434}

cargo build -q -p loopd -p inferproxy
bin=${CARGO_TARGET_DIR:-$root/target}/debug
INFERPROXY_BIN=${INFERPROXY_BIN:-$bin/inferproxy}

run=$(mktemp -d "${TMPDIR:-/tmp}/boxmaker-verify-XXXXXX")
proxy=
cleanup() {
  local status=$?
  [ -n "$proxy" ] && kill -TERM "$proxy" 2>/dev/null && wait "$proxy" 2>/dev/null
  rm -rf "$run"
  exit $status
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

config=$run/loopd.toml
if [ -n "${LOOPD_CONFIG:-}" ]; then
  # The same config with the socket line pointing at this script's proxy.
  grep -v '^socket[[:space:]]*=' "$LOOPD_CONFIG" >"$run/rest.toml"
  { echo "socket = \"$run/infer.sock\""; cat "$run/rest.toml"; } >"$config"
  MODEL=${MODEL:-$(sed -n 's/^model[[:space:]]*=[[:space:]]*"\(.*\)"/\1/p' "$config" | head -n 1)}
else
  missing=
  for v in MODEL EXPECT_SHA256 N_CTX SLOTS; do [ -n "${!v:-}" ] || missing="$missing $v"; done
  if [ -n "$missing" ]; then
    echo "verify-device: set LOOPD_CONFIG, or all of MODEL EXPECT_SHA256 N_CTX SLOTS (missing:$missing)" >&2
    exit 2
  fi
  cat >"$config" <<TOML
socket = "$run/infer.sock"
model = "$MODEL"

[expect]
chat_template_sha256 = "$EXPECT_SHA256"
n_ctx = $N_CTX
total_slots = $SLOTS
TOML
fi

"$INFERPROXY_BIN" --listen "$run/infer.sock" --upstream "$UPSTREAM" 2>"$run/proxy.log" &
proxy=$!
for _ in $(seq 100); do [ -S "$run/infer.sock" ] && break; sleep 0.05; done

echo "== verify-device: loopd selftest against $UPSTREAM (model $MODEL)"
"$bin/loopd" selftest --config "$config"
echo "== verify-device: device tests (slot 0)"
LOOPD_CONFIG=$config INFERPROXY_BIN=$INFERPROXY_BIN UPSTREAM=$UPSTREAM \
  cargo test -q -p loopd --test device -- --ignored --test-threads=1
echo "== verify-device: passed against $UPSTREAM"
