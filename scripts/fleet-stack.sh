#!/usr/bin/env bash
# Several inference hosts on this one box, as issue 33's real-process tests and figures use them.
# Per host (named a, b, c, ...):
#   llama-worker running the llama-server router (scripts/serve.sh: the cached build and model,
#   2 slots), pinned to one core (`taskset -c i%nproc`; the router and its model instance
#   inherit it), one thread (`threads = 1` in the preset), a port and a status socket of its own;
#   inferproxy in front of its server; and two socat forwarders standing in for the SSH tunnel:
#     RUN/HOST/infer.sock  -> RUN/HOST/proxy.sock   (inferproxy: the tunnel's -L to llama-server)
#     RUN/HOST/status.sock -> RUN/HOST/worker.sock  (the worker's own status socket)
# and RUN/loopd.toml, a loopd config with one [[host]] per host (host a also as the single-host
# `socket` and `[runner] worker_socket`), and RUN/loopd-single.toml, the same without [[host]]
# for a loopd that does not read it yet.
#
#   scripts/fleet-stack.sh up                  until Ctrl-C (make fleet-up HOSTS=2)
#   scripts/fleet-stack.sh start RUN           in the background; returns once every host is ready
#   scripts/fleet-stack.sh stop RUN            stops what `start RUN` started; removes RUN
#   scripts/fleet-stack.sh forward RUN HOST    starts HOST's two forwarders again (a healed partition)
#   scripts/fleet-stack.sh instance RUN HOST   prints HOST's model instance pid as it is now
#
# RUN must be new or empty; socket paths must fit in 107 bytes, so keep it short (/tmp/...).
# RUN/hosts.env (shell-sourceable; no value needs quoting) says where everything is:
# FLEET_HOSTS (a,b), FLEET_CONFIG, FLEET_CONFIG_SINGLE; per host A_CORE, A_PORT (the server's),
# A_INFER_SOCKET and A_STATUS_SOCKET (the forwarded ends: what loopd opens), A_PROXY_SOCKET and
# A_WORKER_SOCKET (the host's own, behind the forwarders); and every process: A_WORKER_PID, A_PROXY_PID,
# A_FWD_INFER_PID, A_FWD_STATUS_PID (each forwarder leads its own process group: `kill -KILL --
# -$B_FWD_INFER_PID` cuts the listener and every open relay, a partition; `kill -STOP --
# -$B_FWD_INFER_PID` freezes them, a black hole), and, as seen when the host got ready,
# A_ROUTER_PID, A_SERVER_PGID and A_INSTANCE_PID. The worker replaces the router on a restart:
# `instance RUN HOST` asks the worker again.
#
# Environment: HOSTS (2; 1 to 26), FLEET_THREADS (1), FLEET_READY_S (180: the deadline for every
# worker `ready`, with what each host last said when it passes), FLEET_STOP_S (20);
# FLEET_OWNER_PID (`start`): a process whose end stops the run, as `stop RUN` would (a test
# passes its own pid, so a test killed before its stop leaves nothing running);
# LLAMA_WORKER_BIN and INFERPROXY_BIN name built binaries (otherwise the workspace's are built);
# PRESET_EXTRA (preset lines, `cache-ram = 0`) and WORKER_CONFIG_EXTRA (worker config lines)
# reach every host's serve.sh.
#
# Only this script signals what it starts: each process runs in a session of its own (setsid),
# so a Ctrl-C reaches the script alone. The logs (per host: worker.log, llama-server.log,
# proxy.log, forward.log) stay in RUN, and RUN is removed when everything stopped cleanly; on a
# failure the script prints the last lines of each log and keeps them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
umask 077
cmd=${1:-up}
shift || true

say() { echo "fleet-stack: $*" >&2; }
die() { say "$*"; exit 1; }

FLEET_STOP_S=${FLEET_STOP_S:-20}
# Every variable hosts.env holds for one host, after its upper-case name and `_`.
HOST_VARS="CORE PORT DIR INFER_SOCKET STATUS_SOCKET PROXY_SOCKET WORKER_SOCKET WORKER_PID PROXY_PID
FWD_INFER_PID FWD_STATUS_PID ROUTER_PID SERVER_PGID INSTANCE_PID"

alive() { # pid: running (a zombie is not)
  local s
  s=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ $s != Z* ]]
}

get() { local v="${1}_$2"; echo "${!v:-}"; } # HOST VAR
put() { declare -g "${1}_$2=$3"; }            # HOST VAR VALUE

write_env() {
  local h H v tmp=$run/.hosts.env
  {
    echo "# scripts/fleet-stack.sh: the processes of run $run"
    # Comma-separated, so that no value needs quoting for a reader that is not a shell.
    printf 'FLEET_RUN=%q\nFLEET_HOSTS=%q\nFLEET_CONFIG=%q\nFLEET_CONFIG_SINGLE=%q\nFLEET_WORKER_BIN=%q\n' \
      "$run" "${hosts// /,}" "$run/loopd.toml" "$run/loopd-single.toml" "$worker_bin"
    printf 'FLEET_WATCH_PID=%q\n' "${FLEET_WATCH_PID:-}"
    for h in $hosts; do
      H=${h^^}
      for v in $HOST_VARS; do printf '%s_%s=%q\n' "$H" "$v" "$(get "$H" "$v")"; done
    done
  } >"$tmp"
  mv "$tmp" "$run/hosts.env"
}

load_env() {
  [ -f "$run/hosts.env" ] || die "no $run/hosts.env: not a run of this script"
  # shellcheck disable=SC1091
  . "$run/hosts.env"
  hosts=${FLEET_HOSTS//,/ }
  worker_bin=$FLEET_WORKER_BIN
}

bins() {
  worker_bin=${LLAMA_WORKER_BIN:-}
  proxy_bin=${INFERPROXY_BIN:-}
  if [ -z "$worker_bin" ] || [ -z "$proxy_bin" ]; then
    cargo build -q -p llama-worker -p inferproxy
    local dir=${CARGO_TARGET_DIR:-$root/target}/debug
    worker_bin=${worker_bin:-$dir/llama-worker}
    proxy_bin=${proxy_bin:-$dir/inferproxy}
  fi
}

worker_status() { # socket
  timeout 5 "$worker_bin" status --socket "$1" 2>&1 || true
}

json_field() { # json key: the top-level value of key, or nothing (not JSON, no such key, null)
  python3 -c 'import json, sys
try:
    v = json.loads(sys.argv[1]).get(sys.argv[2])
except (ValueError, AttributeError):
    v = None
print("" if v is None else v)' "$1" "$2"
}

# The two forwarders of host $1, each in a session (and process group) of its own.
start_forwarders() {
  local H=${1^^} dir
  dir=$(get "$H" DIR)
  setsid socat "UNIX-LISTEN:$dir/infer.sock,fork,unlink-early" "UNIX-CONNECT:$dir/proxy.sock" \
    </dev/null >/dev/null 2>>"$dir/forward.log" &
  put "$H" FWD_INFER_PID $!
  setsid socat "UNIX-LISTEN:$dir/status.sock,fork,unlink-early" "UNIX-CONNECT:$dir/worker.sock" \
    </dev/null >/dev/null 2>>"$dir/forward.log" &
  put "$H" FWD_STATUS_PID $!
}

start_host() { # index name
  local i=$1 h=$2 H=${2^^} dir port core
  dir=$run/$h
  mkdir -p "$dir"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  core=$((i % ncpu))
  put "$H" CORE "$core"
  put "$H" PORT "$port"
  put "$H" DIR "$dir"
  put "$H" INFER_SOCKET "$dir/infer.sock"
  put "$H" STATUS_SOCKET "$dir/status.sock"
  put "$H" PROXY_SOCKET "$dir/proxy.sock"
  put "$H" WORKER_SOCKET "$dir/worker.sock"
  # One thread per host: the preset's spelling of --threads (batch threads follow it).
  echo "threads = ${FLEET_THREADS:-1}" >"$dir/preset-extra.ini"
  if [ -n "${PRESET_EXTRA:-}" ]; then cat "$PRESET_EXTRA" >>"$dir/preset-extra.ini"; fi
  LLAMA_WORKER_BIN=$worker_bin PRESET_EXTRA=$dir/preset-extra.ini \
    setsid taskset -c "$core" "$root/scripts/serve.sh" --port "$port" \
    --status-socket "$dir/worker.sock" --server-log "$dir/llama-server.log" \
    </dev/null >"$dir/worker.log" 2>&1 &
  put "$H" WORKER_PID $!
  # inferproxy runs on the inference host, beside its server: same core.
  setsid taskset -c "$core" "$proxy_bin" --listen "$dir/proxy.sock" --upstream "127.0.0.1:$port" \
    </dev/null >/dev/null 2>"$dir/proxy.log" &
  put "$H" PROXY_PID $!
  start_forwarders "$h"
  write_env
}

# Every host's worker `ready` through its forwarded status socket, and its server answering
# /health through its forwarded inference socket; then the pids of its router and model
# instance, and the instance's CPU affinity, which must be the host's core alone.
wait_ready() {
  local deadline=$((SECONDS + ${FLEET_READY_S:-180})) h H left seen status code pid
  declare -A last=()
  left=$hosts
  while [ -n "$left" ]; do
    local still=
    for h in $left; do
      H=${h^^}
      for pid in "$(get "$H" WORKER_PID)" "$(get "$H" PROXY_PID)" "$(get "$H" FWD_INFER_PID)" \
        "$(get "$H" FWD_STATUS_PID)"; do
        alive "$pid" || die "host $h: process $pid exited while starting (host $h last said: ${last[$h]:-nothing})"
      done
      status=$(worker_status "$(get "$H" STATUS_SOCKET)")
      seen="status: $status"
      if [ "$(json_field "$status" state)" = ready ]; then
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 \
          --unix-socket "$(get "$H" INFER_SOCKET)" http://fleet/health || true)
        seen="$seen; /health through infer.sock: $code"
        if [ "$code" = 200 ]; then
          ready_host "$h" "$status" && continue
          seen="$seen; $ready_problem"
        fi
      fi
      last[$h]=$seen
      still="$still $h"
    done
    left=${still# }
    [ -z "$left" ] && break
    if [ $SECONDS -ge $deadline ]; then
      for h in $left; do say "host $h not ready after ${FLEET_READY_S:-180} s; last saw: ${last[$h]}"; done
      exit 1
    fi
    sleep 0.2
  done
}

ready_problem=
ready_host() { # host status-json
  local h=$1 H=${1^^} router pgid instance want got
  router=$(json_field "$2" pid)
  pgid=$(json_field "$2" pgid)
  instance=$(pgrep -P "$router" | head -n 1 || true)
  if [ -z "$instance" ]; then ready_problem="router $router has no model instance yet"; return 1; fi
  want=$(get "$H" CORE)
  got=$(taskset -cp "$instance" 2>/dev/null | sed 's/.*: //')
  [ "$got" = "$want" ] || die "host $h: model instance $instance runs on cores '$got', not $want"
  put "$H" ROUTER_PID "$router"
  put "$H" SERVER_PGID "$pgid"
  put "$H" INSTANCE_PID "$instance"
  write_env
  say "host $h ready after $((SECONDS - t0)) s on core $want (taskset -cp $instance: $got):" \
    "worker $(get "$H" WORKER_PID), router $router, instance $instance, proxy $(get "$H" PROXY_PID)," \
    "forwarders $(get "$H" FWD_INFER_PID) $(get "$H" FWD_STATUS_PID)"
}

# RUN/loopd.toml: one [[host]] per host, and host a as the single-host `socket` and
# `[runner] worker_socket`. RUN/loopd-single.toml: the same without [[host]], for a loopd
# that does not read [[host]] yet (its config refuses unknown keys).
write_config() {
  local template=$root/fixtures/templates/smollm2-tools-thinking.jinja h
  {
    cat <<TOML
# Written by scripts/fleet-stack.sh. Host a is also the single-host socket and worker_socket.
socket = "$A_INFER_SOCKET"
model = "smollm2"

[expect]
chat_template_sha256 = "$(sha256sum "$template" | cut -d' ' -f1)"
n_ctx = 4096
total_slots = 2

[sampling]
# Greedy, seeded, as scripts/local-stack.sh.
temperature = 0.0
seed = 42

[runner]
worker_socket = "$A_STATUS_SOCKET"

[daemon]
socket = "$run/loopd.sock"
store = "$run/loopd.db"
TOML
  } >"$run/loopd-single.toml"
  {
    cat "$run/loopd-single.toml"
    for h in $hosts; do
      cat <<TOML

[[host]]
name = "$h"
infer_socket = "$run/$h/infer.sock"
worker_socket = "$run/$h/status.sock"
slots = [0, 1]
TOML
    done
  } >"$run/loopd.toml"
}

# Stops every process hosts.env names (and each server group the workers run now): the
# forwarders' groups, the proxies, then one SIGTERM to each worker, which stops its server (a
# second would make it kill the server at once). Whatever is left after FLEET_STOP_S is killed
# and named, and the stop fails. Sets `stopped_clean`.
stop_all() {
  local h H pid pgid status deadline left=() groups=()
  stopped_clean=1
  for h in $hosts; do
    H=${h^^}
    # The worker's server group now (it changes on a restart), and the one seen at ready.
    status=$(worker_status "$(get "$H" WORKER_SOCKET)")
    pgid=$(json_field "$status" pgid)
    for g in $pgid $(get "$H" SERVER_PGID); do [[ $g =~ ^[1-9][0-9]*$ ]] && groups+=("$g"); done
    for pid in "$(get "$H" FWD_INFER_PID)" "$(get "$H" FWD_STATUS_PID)"; do
      [ -n "$pid" ] && kill -TERM -- "-$pid" 2>/dev/null || true
      # A stopped forwarder (a black hole) must be continued to see its TERM.
      [ -n "$pid" ] && kill -CONT -- "-$pid" 2>/dev/null || true
    done
    pid=$(get "$H" PROXY_PID)
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null || true
    pid=$(get "$H" WORKER_PID)
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null || true
  done
  deadline=$((SECONDS + FLEET_STOP_S))
  while :; do
    left=()
    for h in $hosts; do
      H=${h^^}
      for v in FWD_INFER_PID FWD_STATUS_PID PROXY_PID WORKER_PID; do
        pid=$(get "$H" "$v")
        [ -n "$pid" ] && alive "$pid" && left+=("$pid")
      done
    done
    for g in "${groups[@]}"; do
      for pid in $(pgrep -g "$g" || true); do alive "$pid" && left+=("$pid"); done
    done
    [ ${#left[@]} -eq 0 ] && break
    if [ $SECONDS -ge $deadline ]; then
      say "still running ${FLEET_STOP_S} s after SIGTERM, killed: $(ps -o pid=,args= -p "$(
        IFS=,
        echo "${left[*]}"
      )" | tr '\n' ';')"
      for pid in "${left[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
      for g in "${groups[@]}"; do kill -KILL -- "-$g" 2>/dev/null || true; done
      stopped_clean=
      break
    fi
    sleep 0.1
  done
}

show_logs() {
  local h H log
  for h in $hosts; do
    H=${h^^}
    [ -S "$(get "$H" WORKER_SOCKET)" ] &&
      say "host $h: llama-worker status: $(worker_status "$(get "$H" WORKER_SOCKET)")"
    for log in worker.log llama-server.log proxy.log forward.log; do
      [ -s "$run/$h/$log" ] || continue
      say "host $h: last lines of $log:"
      tail -n 15 "$run/$h/$log" | sed 's/^/  | /' >&2 || true
    done
  done
}

# Starts every host; on any failure (or a signal) before they are all ready, stops everything,
# shows and keeps the logs. `keep_running` is set once `start` may leave them behind.
keep_running=
failed_start() {
  local status=$?
  [ -n "$keep_running" ] && exit "$status"
  [ "$status" -eq 0 ] && status=1
  trap - EXIT INT TERM
  show_logs
  stop_all
  say "failed; logs kept in $run"
  exit "$status"
}

start_run() {
  local i=0 h
  [[ ${HOSTS} =~ ^[0-9]+$ ]] && [ "$HOSTS" -ge 1 ] && [ "$HOSTS" -le 26 ] ||
    die "HOSTS=$HOSTS: 1 to 26 hosts"
  if [ -e "$run" ] && [ -n "$(ls -A "$run")" ]; then die "$run is not empty"; fi
  mkdir -p "$run"
  local longest="$run/a/status.sock"
  [ ${#longest} -lt 108 ] || die "$run is too long for a Unix socket path (${#longest} bytes; at most 107)"
  command -v socat >/dev/null || die "socat is missing (make socat installs it)"
  hosts=
  for i in $(seq 0 $((HOSTS - 1))); do hosts="$hosts $(printf "\\x$(printf %x $((97 + i)))")"; done
  hosts=${hosts# }
  "$root/scripts/llama-server.sh" all >/dev/null
  bins
  ncpu=$(nproc)
  trap failed_start EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  t0=$SECONDS
  i=0
  for h in $hosts; do
    start_host "$i" "$h"
    i=$((i + 1))
  done
  write_config
  wait_ready
  say "$HOSTS host(s) ready after $((SECONDS - t0)) s; run $run (hosts.env, loopd.toml, loopd-single.toml)"
}

HOSTS=${HOSTS:-2}
case $cmd in
  up)
    if [ -t 0 ] && [ -z "${FLEET_STACK_JOB:-}" ]; then
      FLEET_STACK_JOB=1 exec python3 "$root/scripts/foreground.py" "$0" up "$@"
    fi
    run=$(mktemp -d "${TMPDIR:-/tmp}/boxmaker-fleet-XXXXXX")
    start_run
    keep_running=1
    interrupted=
    stop_up() {
      local status=$? pid rc
      [ -n "$interrupted" ] && status=0
      trap - EXIT INT TERM
      stop_all
      # Reap the children, and judge how each took its SIGTERM.
      for h in $hosts; do
        H=${h^^}
        for v in FWD_INFER_PID FWD_STATUS_PID PROXY_PID WORKER_PID; do
          pid=$(get "$H" "$v")
          rc=0
          wait "$pid" 2>/dev/null || rc=$?
          # 143: died of the TERM; 127: already reaped. A forwarder started again by `forward`
          # from another shell is not this shell's child.
          if [ $rc -ne 0 ] && [ $rc -ne 143 ] && [ $rc -ne 127 ]; then
            say "host $h: $v $pid exited $rc on SIGTERM"
            stopped_clean=
          fi
        done
      done
      if [ "$status" -eq 0 ] && [ -n "$stopped_clean" ]; then
        rm -rf "$run"
        [ -n "$interrupted" ] && say "stopped by Ctrl-C; every host stopped cleanly"
      else
        show_logs
        say "logs kept in $run"
        [ "$status" -eq 0 ] && status=1
      fi
      exit "$status"
    }
    trap stop_up EXIT
    trap 'interrupted=1; exit 130' INT
    trap 'exit 143' TERM
    cat "$run/hosts.env"
    say "up (Ctrl-C stops every host). Config: $run/loopd.toml"
    while :; do sleep 1; done
    ;;
  start)
    [ $# -eq 1 ] || die "usage: $0 start RUN"
    run=$1
    start_run
    keep_running=1
    trap - EXIT INT TERM
    if [ -n "${FLEET_OWNER_PID:-}" ]; then
      # The owner's watch: `stop RUN` once the owner is gone, so a test killed before its
      # own stop leaves nothing running. `stop` ends the watch first.
      setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 0.5; done; exec "$2" stop "$3"' \
        fleet-owner-watch "$FLEET_OWNER_PID" "$root/scripts/fleet-stack.sh" "$run" \
        </dev/null >/dev/null 2>>"$run/owner-watch.log" &
      FLEET_WATCH_PID=$!
      write_env
    fi
    echo "$run"
    ;;
  stop)
    [ $# -eq 1 ] || die "usage: $0 stop RUN"
    run=$1
    load_env
    # The owner's watch runs this same command when the owner is gone (then it is this process).
    if [ -n "${FLEET_WATCH_PID:-}" ] && [ "$FLEET_WATCH_PID" != $$ ]; then
      kill -TERM -- "-$FLEET_WATCH_PID" 2>/dev/null || true
    fi
    stop_all
    if [ -n "$stopped_clean" ]; then
      rm -rf "$run"
    else
      show_logs
      say "logs kept in $run"
      exit 1
    fi
    ;;
  forward)
    [ $# -eq 2 ] || die "usage: $0 forward RUN HOST"
    run=$1
    load_env
    [[ " $hosts " == *" $2 "* ]] || die "no host $2 in $run (hosts: $hosts)"
    H=${2^^}
    for pid in "$(get "$H" FWD_INFER_PID)" "$(get "$H" FWD_STATUS_PID)"; do
      alive "$pid" && die "host $2: forwarder $pid is still running (kill its group first)"
    done
    start_forwarders "$2"
    write_env
    echo "$(get "$H" FWD_INFER_PID) $(get "$H" FWD_STATUS_PID)"
    ;;
  instance)
    [ $# -eq 2 ] || die "usage: $0 instance RUN HOST"
    run=$1
    load_env
    status=$(worker_status "$(get "${2^^}" WORKER_SOCKET)")
    router=$(json_field "$status" pid)
    [ -n "$router" ] && [ "$router" != null ] || die "host $2: no router pid in $status"
    pgrep -P "$router" | head -n 1 || die "host $2: router $router has no model instance"
    ;;
  *) die "unknown command $cmd (up, start RUN, stop RUN, forward RUN HOST, instance RUN HOST)" ;;
esac
