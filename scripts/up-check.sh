#!/usr/bin/env bash
# make up-check: `make up` as a person runs it, in a real terminal (tmux): once it says the stack
# is up, one Ctrl-C. It must exit 0, say it stopped cleanly, leave no process of its run behind
# and delete its log folder (docs/production.md, issue 32 item 4).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
SUDO=$([ "$(id -u)" -eq 0 ] || echo sudo)
command -v tmux >/dev/null || { $SUDO apt-get update -qq &&
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null; }

out=$(mktemp "${TMPDIR:-/tmp}/up-check-XXXXXX")
session="up-check-$$"
trap 'tmux kill-session -t "$session" 2>/dev/null || true; rm -f "$out"' EXIT
# An interactive shell types the command, as a person would (its job control puts make in the
# terminal's foreground group, where the Ctrl-C lands).
tmux new-session -d -s "$session" -x 200 -y 50 "bash --norc --noprofile -i"
tmux send-keys -t "$session" "cd '$root' && make up > '$out' 2>&1; echo \"make-exit=\$?\" >> '$out'" Enter

# Waits up to $2 seconds for $1 in the output; fails saying what it last saw.
wait_for() {
  for _ in $(seq $(($2 * 10))); do
    grep -q "$1" "$out" && return 0
    sleep 0.1
  done
  echo "up-check: waited $2 s for '$1'; make up said:" >&2
  sed 's/^/  | /' "$out" >&2
  exit 1
}

wait_for 'are up (Ctrl-C stops all three)' 900
run=$(sed -n 's/^Logs: \([^ ]*\) .*/\1/p' "$out" | head -1)
[ -d "$run" ] || { echo "up-check: no log folder named in the banner" >&2; cat "$out" >&2; exit 1; }
tmux send-keys -t "$session" C-c
wait_for 'make-exit=' 120
fail=
grep -q '^make-exit=0$' "$out" || fail="make did not exit 0"
grep -q 'stopped by Ctrl-C; llama-worker, inferproxy and loopd serve stopped cleanly' "$out" ||
  fail="${fail:+$fail; }no clean-stop line"
[ ! -e "$run" ] || fail="${fail:+$fail; }the log folder $run is still there"
# Read-only look for this run's processes (their command lines name its folder).
left=$(pgrep -f -- "$run" || true)
[ -z "$left" ] || fail="${fail:+$fail; }processes of the run left: $left"
if [ -n "$fail" ]; then
  echo "up-check: $fail; make up said:" >&2
  sed 's/^/  | /' "$out" >&2
  exit 1
fi
echo "up-check: make up stopped by one Ctrl-C: exit 0, stopped cleanly, nothing left, logs removed"
