#!/usr/bin/env bash
# The production install, run without systemd (make install-check): the files of
# docs/production.md installed under a temporary root, the three daemons started with exactly
# the ExecStart= command lines of docs/{llama-worker,inferproxy,loopd}.service (every absolute
# path under /etc, /usr, /var and /run moved into the root, and the router's port 11434 replaced
# by a free one so the check never meets a server of this host), then one agent request
# submitted to loopd and its result read. A unit, its example config, the preset and the
# template cannot drift apart: a path, a socket, a hash or a flag that disagree stop a daemon or
# the request, and the step is named.
#
# Also: `llama-worker check-config` passes on both example worker configs as installed, and
# both daemons write their metrics into the one shared folder.
# Needs the cached llama-server and model (scripts/llama-server.sh all). Exit 0 only when all
# of it passed; on failure the daemons' logs are printed and kept in the root.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
docs=$repo/docs

server=$(scripts/llama-server.sh build)
rpc_server=$(dirname "$server")/ggml-rpc-server
model_dir=$(scripts/llama-server.sh model)
cargo build -p loopd -p inferproxy -p llama-worker
bin=${CARGO_TARGET_DIR:-$repo/target}/debug

root=$(mktemp -d "${TMPDIR:-/tmp}/boxmaker-install-XXXXXX")
pids=()
names=()
ok=0
cleanup() {
  local status=$?
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[$i]}" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ $ok -eq 1 ]; then
    rm -rf "$root"
  else
    for log in "$root"/logs/*.log "$root"/var/log/llama-worker/server.log; do
      [ -s "$log" ] || continue
      echo "install-check: last lines of $log:" >&2
      tail -n 20 "$log" | sed 's/^/  | /' >&2
    done
    echo "install-check: FAILED; the root is kept: $root" >&2
    [ $status -ne 0 ] || status=1
  fi
  exit $status
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
die() { echo "install-check: FAIL: $*" >&2; exit 1; }
step() { echo "install-check: $*"; }

# Absolute paths under /etc /usr /var /run, moved into the root (in any text: configs, args).
remap() { sed -E "s#(^|[^A-Za-z0-9_./-])/(etc|usr|var|run)/#\1$root/\2/#g"; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

# The install, as docs/production.md lists it.
install -d "$root/usr/local/bin" "$root/usr/local/lib/boxmaker" "$root/var/lib/llama/models" \
  "$root/etc/llama-worker" "$root/etc/loopd" "$root/logs"
for b in loopd inferproxy llama-worker; do ln -s "$bin/$b" "$root/usr/local/bin/$b"; done
ln -s "$server" "$root/usr/local/lib/boxmaker/llama-server"
ln -s "$rpc_server" "$root/usr/local/lib/boxmaker/ggml-rpc-server"
ln -s "$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf" "$root/var/lib/llama/models/"
remap <crates/llama-worker/llama-worker.example.toml >"$root/etc/llama-worker/llama-worker.toml"
remap <crates/llama-worker/llama-worker.rpc.example.toml >"$root/etc/llama-worker/llama-worker.rpc.toml"
remap <"$docs/llama-server.preset.ini" >"$root/etc/llama-worker/preset.ini"
cp fixtures/templates/smollm2-tools-thinking.jinja "$root/etc/llama-worker/chat-template.jinja"
remap <"$docs/loopd.example.toml" >"$root/etc/loopd/loopd.toml"
# What systemd makes before the start: RuntimeDirectory=, LogsDirectory=, StateDirectory=, and
# docs/boxmaker.tmpfiles.conf's metrics folder.
install -d -m 0750 "$root/run/llama-worker" "$root/run/inferproxy" "$root/run/loopd" \
  "$root/var/log/llama-worker"
install -d -m 0700 "$root/var/lib/loopd"
metrics_dir=$(awk '$1 == "d" { print $2 }' "$docs/boxmaker.tmpfiles.conf")
install -d -m 2775 "$root$metrics_dir"

# The examples pass their checks as installed.
for c in llama-worker.toml llama-worker.rpc.toml; do
  out=$("$bin/llama-worker" check-config --config "$root/etc/llama-worker/$c" 2>&1) ||
    die "llama-worker check-config --config /etc/llama-worker/$c: $out"
  step "llama-worker check-config /etc/llama-worker/$c: ok"
done
want=$(sed -n 's/^chat_template_sha256 = "\([0-9a-f]*\)".*/\1/p' "$docs/loopd.example.toml")
got=$(sha256sum "$root/etc/llama-worker/chat-template.jinja" | cut -d' ' -f1)
[ "$want" = "$got" ] || die "docs/loopd.example.toml expects template $want, the installed one is $got"

# A unit's ExecStart=, remapped, the port replaced; one word per array item (the units quote
# nothing).
exec_start() {
  local line
  line=$(sed -n 's/^ExecStart=//p' "$docs/$1" | remap | sed "s/\b11434\b/$port/g")
  [ -n "$line" ] || die "no ExecStart= in docs/$1"
  read -r -a cmd <<<"$line"
}
start() { # unit name
  exec_start "$1"
  step "starting $2: ${cmd[*]}"
  # As systemd sets them for the unit's directories.
  RUNTIME_DIRECTORY=$root/run/$2 STATE_DIRECTORY=$root/var/lib/$2 LOGS_DIRECTORY=$root/var/log/$2 \
    "${cmd[@]}" </dev/null >"$root/logs/$2.log" 2>&1 &
  pids+=($!)
  names+=("$2")
}
wait_socket() { # path name pid seconds
  local end=$((SECONDS + $4))
  while [ ! -S "$1" ]; do
    kill -0 "$3" 2>/dev/null || die "$2 exited before it opened $1"
    [ $SECONDS -lt $end ] || die "$2 did not open $1 within $4 s"
    sleep 0.1
  done
}

start llama-worker.service llama-worker
wait_socket "$root/run/llama-worker/status.sock" llama-worker "${pids[-1]}" 30
[ "$(stat -c %a "$root/run/llama-worker/status.sock")" = 660 ] || die "the worker's status socket is not 0660"
start inferproxy.service inferproxy
wait_socket "$root/run/inferproxy/infer.sock" inferproxy "${pids[-1]}" 30
[ "$(stat -c %a "$root/run/inferproxy/infer.sock")" = 660 ] || die "inferproxy's socket is not 0660"
start loopd.service loopd
# loopd opens its socket after the model loaded and its self-test passed (READY=1).
wait_socket "$root/run/loopd/loopd.sock" loopd "${pids[-1]}" 300
step "all three up; loopd's self-test passed against the installed template and preset"

loopd=$root/usr/local/bin/loopd
sock=$root/run/loopd/loopd.sock
# A question with a one-word answer: this checks the path, not the model, and a slow box
# generating a long answer would only make the check slow.
submitted=$("$loopd" submit --socket "$sock" --budget 1 "Answer with one word: is 7 greater than 3?") ||
  die "loopd submit exited $?: $submitted"
id=$(echo "$submitted" | grep -o 'req-[0-9]*' | head -n 1)
[ -n "$id" ] || die "loopd submit printed no request id: $submitted"
result=$("$loopd" result --socket "$sock" --wait 600 --json "$id") || die "loopd result $id exited $?: $result"
echo "$result" | python3 -c '
import json, sys
r = json.load(sys.stdin)["result"]
outcome = r.get("outcome")
if outcome != "completed":
    sys.exit(f"request outcome {outcome!r}, not completed: {r}")
' || die "the request did not complete"
step "request $id completed through loopd serve, inferproxy, llama-worker's llama-server"

# Both daemons write into the one metrics folder (their first write comes at start).
for f in llama-worker.prom loopd.prom; do
  end=$((SECONDS + 30))
  while [ ! -s "$root$metrics_dir/$f" ]; do
    [ $SECONDS -lt $end ] || die "no $metrics_dir/$f within 30 s"
    sleep 0.5
  done
done
step "metrics: $metrics_dir/llama-worker.prom and loopd.prom written"

# Stop as systemd does (loopd first: it depends on the other two); each must exit 0.
for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
  kill -TERM "${pids[$i]}"
  rc=0
  wait "${pids[$i]}" || rc=$?
  [ $rc -eq 0 ] || die "${names[$i]} exited $rc on SIGTERM"
  unset 'pids[i]'
done
step "all three stopped on SIGTERM with status 0"
ok=1
