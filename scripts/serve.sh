#!/usr/bin/env bash
# Runs the local llama-server in router mode, in the foreground, as the production router runs:
# a --models-preset INI over the cached model, 127.0.0.1, 2 slots, /slots on, jinja on; under
# llama-worker, which restarts it when it dies or hangs and stops it on SIGTERM.
#
#   scripts/serve.sh [--port N] [--status-socket PATH] [--server-log PATH]
#
# --port defaults to a free port; --status-socket to $BOXMAKER_CACHE/run/worker-PORT.sock
# (`llama-worker status --socket PATH` reads it); --server-log sends the router's and its model
# instances' output to a file (default: this terminal, with the worker's own lines).
# $LLAMA_WORKER_BIN names a built llama-worker; without it the script builds the workspace's.
# The worker requires the model to be loaded for `ready` (`models` in its config): a model that
# cannot load makes it `failed`, with the reason in `llama-worker status`.
#
# The preset names one model, $MODEL_ID, with the project's chat template
# (fixtures/templates/smollm2-tools-thinking.jinja); docs/inference-contract.md says why.
# $MODEL_FILE names another GGUF to serve under that id (the tests of a model that cannot load).
# $WORKER_CONFIG_EXTRA names a file of llama-worker config lines appended to the generated config
# (the tests that scale the worker's timers down).
# $PRESET_EXTRA names a file of preset lines (llama-server flags without dashes: `b = 4096`)
# appended to the model's section (the long-prefill test evaluates its prompt in one batch).
# The preset and the worker's config are written to a temp folder that is removed before the
# worker starts; the worker (this script's pid, after exec) holds them open as fds 8 and 9 and
# names them /proc/PID/fd/8 and 9, so nothing is left on disk however the run ends
# (`cat /proc/PID/fd/9` shows the config while it runs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
MODEL_ID=${MODEL_ID:-smollm2}
CTX=${CTX:-8192}   # total; each of the 2 slots gets CTX/2
port=
status_socket=
server_log=
while [ $# -gt 0 ]; do
  case $1 in
    --port) port=$2; shift 2 ;;
    --status-socket) status_socket=$2; shift 2 ;;
    --server-log) server_log=$2; shift 2 ;;
    -h | --help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "serve.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
server=$("$root/scripts/llama-server.sh" build)
model_dir=$("$root/scripts/llama-server.sh" model)
if [ -z "$port" ]; then
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
fi
cache=${BOXMAKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/boxmaker}
mkdir -p "$cache/run"
files=$(mktemp -d "${TMPDIR:-/tmp}/serve-$port.XXXXXX")
trap 'rm -rf "$files"' EXIT
preset=$files/preset.ini
cat >"$preset" <<INI
version = 1

[$MODEL_ID]
model = ${MODEL_FILE:-$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf}
chat-template-file = $root/fixtures/templates/smollm2-tools-thinking.jinja
jinja = true
c = $CTX
np = 2
load-on-startup = true
INI
if [ -n "${PRESET_EXTRA:-}" ]; then cat "$PRESET_EXTRA" >>"$preset"; fi
status_socket=${status_socket:-$cache/run/worker-$port.sock}
worker=${LLAMA_WORKER_BIN:-}
if [ -z "$worker" ]; then
  (cd "$root" && cargo build -q -p llama-worker)
  worker=${CARGO_TARGET_DIR:-$root/target}/debug/llama-worker
fi
exec 8<"$preset"
config=$files/worker.toml
cat >"$config" <<TOML
command = "$server"
args = ["--models-preset", "/proc/$$/fd/8", "--models-max", "1", "--host", "127.0.0.1", "--port", "{port}",
        "--slots", "--jinja"]
status_socket = "$status_socket"
models = ["$MODEL_ID"]
TOML
if [ -n "$server_log" ]; then echo "log_file = \"$server_log\"" >>"$config"; fi
if [ -n "${WORKER_CONFIG_EXTRA:-}" ]; then cat "$WORKER_CONFIG_EXTRA" >>"$config"; fi
exec 9<"$config"
rm -rf "$files"
trap - EXIT
echo "serve.sh: llama-server router on 127.0.0.1:$port, model id $MODEL_ID, under llama-worker (status: $status_socket)" >&2
exec "$worker" run --config "/proc/$$/fd/9" --port "$port"
