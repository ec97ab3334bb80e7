#!/usr/bin/env bash
# The local stack, started, used and stopped in one command:
#   llama-worker -> llama-server router (scripts/serve.sh) <- inferproxy <- loopd
#
#   scripts/local-stack.sh selftest                       (make selftest)
#   scripts/local-stack.sh ask [--thinking] "<prompt>"    (make ask PROMPT="...")
#   scripts/local-stack.sh run [--budget N] [--thinking] [--folder DIR] "<prompt>"   (make run:
#                                                         submitted through `loopd serve`)
#   scripts/local-stack.sh up [--folder DIR]              (make up: the three daemons until Ctrl-C)
#   scripts/local-stack.sh verify                         (make verify-device against the local router)
#
# Builds what is missing (llama-server and the model, cached; the workspace binaries), writes a
# loopd config whose [expect] matches the local model, runs the command, and stops everything it
# started on the way out, also on failure or Ctrl-C. On failure it prints the worker's status
# and the last lines of the worker's and the server's logs (the router's and its model
# instances' output). MODEL_FILE=path serves another GGUF under the same model id (serve.sh).
# The logs are in one folder (the `up` banner names it), deleted on a clean exit and kept when
# something failed.
#
# Only this script signals its children: each runs in a session of its own (setsid), so Ctrl-C
# reaches the script alone, which sends each child one SIGTERM. In a terminal, `up` runs itself
# as the terminal's foreground job (scripts/foreground.py), so make, which would die of the
# SIGINT and say `Interrupt`, does not see the Ctrl-C: it exits 0 and the script says so.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cmd=${1:-selftest}
shift || true

if [ "$cmd" = up ] && [ -t 0 ] && [ -z "${LOCAL_STACK_JOB:-}" ]; then
  LOCAL_STACK_JOB=1 exec python3 "$root/scripts/foreground.py" "$0" up "$@"
fi

"$root/scripts/llama-server.sh" all >/dev/null
# Not -q: the first build takes minutes and shows its progress; a warm one prints one line.
cargo build -p loopd -p inferproxy -p llama-worker
bin=${CARGO_TARGET_DIR:-$root/target}/debug

run=$(mktemp -d "${TMPDIR:-/tmp}/boxmaker-stack-XXXXXX")
pids=()
interrupted=
cleanup() {
  local status=$? worker_status= pid rc
  if [ -n "$interrupted" ] && [ "$cmd" = up ]; then status=0; fi
  if [ $status -ne 0 ] && [ -S "$run/worker.sock" ]; then
    worker_status=$(timeout 5 "$bin/llama-worker" status --socket "$run/worker.sock" 2>/dev/null || true)
  fi
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    rc=0
    wait "$pid" 2>/dev/null || rc=$?
    # 143: it was already gone when the script looked (or died of the TERM): not a failure.
    if [ $rc -ne 0 ] && [ $rc -ne 143 ] && [ $rc -ne 127 ] && [ $status -eq 0 ]; then
      echo "local-stack: a child (pid $pid) exited $rc on SIGTERM" >&2
      status=1
    fi
  done
  if [ $status -ne 0 ]; then
    if [ -n "$worker_status" ]; then
      echo "local-stack: llama-worker status: $worker_status" >&2
    fi
    for log in worker.log llama-server.log proxy.log loopd.log; do
      [ -s "$run/$log" ] || continue
      echo "local-stack: last lines of $log:" >&2
      tail -n 15 "$run/$log" | sed 's/^/  | /' >&2 || true
    done
    echo "local-stack: logs kept in $run" >&2
  else
    rm -rf "$run"
  fi
  if [ -n "$interrupted" ] && [ "$cmd" = up ] && [ $status -eq 0 ]; then
    echo "local-stack: stopped by Ctrl-C; llama-worker, inferproxy and loopd serve stopped cleanly"
  fi
  exit $status
}
trap cleanup EXIT
trap 'interrupted=1; exit 130' INT
trap 'exit 143' TERM

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
LLAMA_WORKER_BIN=$bin/llama-worker setsid "$root/scripts/serve.sh" --port "$port" \
  --status-socket "$run/worker.sock" --server-log "$run/llama-server.log" >"$run/worker.log" 2>&1 &
pids+=($!)
setsid "$bin/inferproxy" --listen "$run/infer.sock" --upstream "127.0.0.1:$port" 2>"$run/proxy.log" &
pids+=($!)

# Only the two sockets are waited for here: loopd's own load wait covers the model load, and it
# asks the worker, so a model that cannot load ends the command with the worker's reason.
for _ in $(seq 300); do
  [ -S "$run/worker.sock" ] && [ -S "$run/infer.sock" ] && break
  sleep 0.1
done
[ -S "$run/worker.sock" ] || { echo "local-stack: llama-worker did not open its socket" >&2; exit 1; }
[ -S "$run/infer.sock" ] || { echo "local-stack: inferproxy did not open its socket" >&2; exit 1; }


template=$root/fixtures/templates/smollm2-tools-thinking.jinja
cat >"$run/loopd.toml" <<TOML
socket = "$run/infer.sock"
model = "smollm2"

[expect]
chat_template_sha256 = "$(sha256sum "$template" | cut -d' ' -f1)"
n_ctx = 4096
total_slots = 2

[sampling]
# Greedy, seeded: the showcase commands answer the same way each time.
temperature = 0.0
seed = 42

[runner]
worker_socket = "$run/worker.sock"

[daemon]
socket = "$run/loopd.sock"
store = "$run/loopd.db"
TOML

# `loopd serve` in the background (its --folder taken from the arguments); waits for its
# socket, which appears only after the model loaded and the self-test passed.
start_loopd() {
  local folder=()
  local a prev=
  for a in "$@"; do
    [ "$prev" = --folder ] && folder=(--folder "$a")
    prev=$a
  done
  setsid "$bin/loopd" serve --config "$run/loopd.toml" "${folder[@]}" 2>"$run/loopd.log" &
  loopd_pid=$!
  pids+=($loopd_pid)
  for _ in $(seq 3000); do
    [ -S "$run/loopd.sock" ] && return 0
    kill -0 "$loopd_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "local-stack: loopd serve did not open its socket; its log:" >&2
  sed 's/^/  | /' "$run/loopd.log" >&2
  exit 1
}

# `loopd run` arguments without --folder DIR (the daemon has it).
without_folder() {
  run_args=()
  while [ $# -gt 0 ]; do
    case $1 in
      --folder) shift 2 ;;
      *) run_args+=("$1"); shift ;;
    esac
  done
}

case $cmd in
  selftest)
    "$bin/loopd" selftest --config "$run/loopd.toml"
    cat <<MSG

To watch one request through the same path (llama-worker, llama-server, inferproxy, loopd):
  make ask PROMPT="Why is the sky blue?"
  make ask PROMPT="What is 2 + 3?" THINKING=1
MSG
    ;;
  ask) "$bin/loopd" ask --config "$run/loopd.toml" "$@" ;;
  run)
    start_loopd "$@"
    without_folder "$@"
    # Worked examples first (scripts/run-example.json: a question, its arithmetic call, the
    # result with the runner's budget note and the answer; then two calls alone, since
    # SmolLM2-135M copies what came last): without them it answered from memory, calling no
    # tool (3 runs of 3).
    "$bin/loopd" submit --socket "$run/loopd.sock" --follow \
      --system "You answer every question by calling a tool." \
      --history "$root/scripts/run-example.json" "${run_args[@]}"
    ;;
  up)
    start_loopd "$@"
    cat <<MSG
local-stack: llama-worker, inferproxy and loopd serve are up (Ctrl-C stops all three).
Logs: $run (worker.log, llama-server.log, proxy.log, loopd.log; kept if something fails)
  $bin/loopd status --socket $run/loopd.sock
  $bin/loopd submit --socket $run/loopd.sock --budget 2 "What is 17 times 23? Use the arithmetic tool."
  $bin/loopd result --socket $run/loopd.sock --wait 120 req-1
MSG
    wait "$loopd_pid"
    ;;
  verify)
    UPSTREAM=127.0.0.1:$port MODEL=smollm2 LOOPD_CONFIG=$run/loopd.toml INFERPROXY_BIN=$bin/inferproxy \
      "$root/scripts/verify-device.sh"
    ;;
  *) echo "local-stack: unknown command $cmd (selftest, ask, run, up, verify)" >&2; exit 2 ;;
esac
