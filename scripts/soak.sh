#!/usr/bin/env bash
# make soak: the tests that run real processes (the real llama-server, llama-worker, inferproxy),
# and `make selftest`, N times each (N=5 by default), with the pass count of each at the end.
# One green run proves little; this is the count that goes into a closing note.
#
#   N=20 scripts/soak.sh            every suite 20 times
#   ONLY=selftest N=20 scripts/soak.sh   one suite (a name from the list below)
#   ONLY=loopd-chaos N=3 scripts/soak.sh make chaos 3 times, each with a new seed (docs/chaos.md)
#
# Each run's output is kept under $SOAK_DIR (a temp dir by default) and a failed run's log path
# is printed. Exit status 0 only when every run of every suite passed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
N=${N:-5}
ONLY=${ONLY:-}
SOAK_DIR=${SOAK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/boxmaker-soak-XXXXXX")}
mkdir -p "$SOAK_DIR"

# name | command. The cargo suites are the integration tests that start real processes. A name
# ending in `:once` runs in the first round only (ONLY= takes the name without it): the wedged
# server on the default timers themselves takes minutes.
suites=(
  "loopd-real-server|cargo test -q --features real-server -p loopd-client --test real_server"
  "loopd-worker-restart|cargo test -q --features real-server -p loopd-client --test worker_restart"
  "loopd-wedged-server|cargo test -q --features real-server -p loopd-agent --test wedged_server"
  "loopd-wedged-server-unscaled:once|WEDGED_FACTOR=1 cargo test -q --features real-server -p loopd-agent --test wedged_server model_instance"
  "loopd-busy-box|cargo test -q --features real-server -p loopd --test busy_box -- --ignored"
  "loopd-slow-opening|cargo test -q --features real-server -p loopd --test busy_box a_tool_calls -- --ignored"
  "loopd-runner-real-server|cargo test -q --features real-server -p loopd-agent --test runner_real_server"
  "loopd-daemon-real-server|cargo test -q --features real-server -p loopd --test daemon_real_server"
  "loopd-sessions-real-server|cargo test -q --features real-server -p loopd --test sessions_real_server"
  "loopd-kv-real-server|cargo test -q --features real-server -p loopd --test kv_real_server"
  "loopd-sessions|cargo test -q -p loopd --test sessions --test serve_signals --test chat_tmux"
  "loopd-broken-model|cargo test -q --features real-server -p loopd --test broken_model"
  "loopd-retry-real-server|cargo test -q --features real-server -p loopd --test retry_real_server"
  "loopd-rpc-unit|cargo test -q --features real-server -p loopd --test rpc_unit"
  "loopd-fleet-real|cargo test -q --features real-server -p loopd --test fleet_real"
  "loopd-fleet-ssh-real|cargo test -q --features real-server -p loopd --test fleet_ssh_real"
  "loopd-fleet|cargo test -q -p loopd-agent --test fleet"
  "harness-local-server|cargo test -q --features real-server -p llama-harness --test local_server"
  "worker-real-server|cargo test -q --features real-server -p llama-worker --test real_server"
  "worker-group|cargo test -q -p llama-worker --test group"
  "worker-rpc|cargo test -q -p llama-worker --test rpc"
  "worker-cli|cargo test -q -p llama-worker --test cli"
  "inferproxy-lifecycle|cargo test -q -p inferproxy --test lifecycle"
  "inferproxy-limits|cargo test -q -p inferproxy --test limits"
  "verify-local|scripts/local-stack.sh verify"
  "selftest|scripts/local-stack.sh selftest"
)

# Minutes per run, so only when named: ONLY=loopd-chaos (CHAOS_N requests each, 50).
if [ "$ONLY" = loopd-chaos ]; then
  suites+=("loopd-chaos|cargo test -q --features real-server -p loopd --test chaos -- --ignored --nocapture")
fi

scripts/llama-server.sh all >/dev/null
# Build everything once, so that no run pays for (or races) a build.
cargo test -q --workspace --all-features --no-run >/dev/null 2>&1 || cargo test --workspace --all-features --no-run
cargo build -q -p loopd -p inferproxy -p llama-worker

declare -A passed
failures=()
for ((i = 1; i <= N; i++)); do
  for entry in "${suites[@]}"; do
    name=${entry%%|*}
    cmd=${entry#*|}
    once=
    [ "${name%:once}" != "$name" ] && once=1 name=${name%:once}
    [ -n "$ONLY" ] && [ "$ONLY" != "$name" ] && continue
    [ -n "$once" ] && [ "$i" -gt 1 ] && continue
    log="$SOAK_DIR/$name-$i.log"
    start=$(date +%s)
    if bash -c "$cmd" >"$log" 2>&1; then
      passed[$name]=$((${passed[$name]:-0} + 1))
      verdict=pass
    else
      failures+=("$log")
      verdict=FAIL
    fi
    printf 'soak: run %d of %d  %-22s %s (%d s)\n' "$i" "$N" "$name" "$verdict" $(($(date +%s) - start))
  done
done

echo
echo "soak: $N runs each, logs in $SOAK_DIR"
total_failed=0
for entry in "${suites[@]}"; do
  name=${entry%%|*}
  runs=$N
  [ "${name%:once}" != "$name" ] && runs=1 name=${name%:once}
  [ -n "$ONLY" ] && [ "$ONLY" != "$name" ] && continue
  p=${passed[$name]:-0}
  total_failed=$((total_failed + runs - p))
  printf '%-22s %d of %d passed\n' "$name" "$p" "$runs"
done
for f in "${failures[@]}"; do echo "failed run: $f"; done
[ "$total_failed" -eq 0 ]
