#!/usr/bin/env bash
# docs/production.md performed on a real systemd (make install-check, part of make test): a
# minimal Debian 12 root filesystem (debootstrap minbase, systemd, dbus, and only the packages
# of the page's `install-check:packages` apt line), booted with systemd-nspawn as PID 1, on
# which the page's own `install-check:install` block runs as written (the checkout and the
# cached llama-server and model bound read-only at /src/boxmaker and their cache paths), then
# what an operator does to it, each step against a deadline that names what it last saw:
#   - the three units active; loopd's self-test lines in its journal before systemd's
#     "Started" line (READY=1 only after the self-test);
#   - a request completed as root and as the user loopd; refused for another user (nobody);
#   - the sockets' and folders' owners and modes as the page's table says;
#   - `systemd-analyze security` (online, on the booted units) as the page's table says;
#   - the page's `install-check:queries` against the live store (sqlite3 -readonly);
#   - each row of "What survives what": `systemctl restart inferproxy` under a streaming
#     request (it completes, loopd keeps its pid); `systemctl restart loopd` (an unfetched
#     result kept, the running request cancelled with the stop named); SIGKILL of the model
#     instance (server_died, then a request completes); `systemctl restart llama-worker`
#     (worker_stopped, and nothing left for systemd to kill); a reboot of the container (the
#     unfetched result kept);
#   - a failed start (libgomp hidden): the worker failed, check-config names the library, loopd
#     refuses to start; the page's `install-check:recover` block, and loopd follows by itself.
# The root filesystem is cached under $BOXMAKER_CACHE keyed by its package list (built in a
# temporary folder, renamed when complete); each run boots a copy of it, removed at the end.
# The container is torn down on every exit (trap). Needs root, debootstrap and
# systemd-container (installed with apt when missing), and the cached llama-server and model.
# The tunnel unit is not part of it (make tunnel-check).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
guide=docs/production.md
cache=${BOXMAKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/boxmaker}
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
start_time=$SECONDS

say() { echo "install-check: $*"; }
die() { echo "install-check: FAIL: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, systemd-nspawn)"

missing=()
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]} with apt"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# A fenced block of the guide marked ```sh install-check:NAME, without its fences.
block() {
  awk -v want="install-check:$1" '
    /^```/ && inside { exit }
    inside { print }
    /^```sh / && $2 == want { inside = 1 }' "$guide"
}
for b in build packages install queries recover; do
  [ -n "$(block "$b")" ] || die "$guide has no \`\`\`sh install-check:$b block"
done

# 1. The build, on this machine, as the page says.
say "build: $(block build | grep -v '^#' | head -n 1 | sed 's/ *#.*//')"
bash -euo pipefail -c "$(block build)" >/dev/null
server=$(scripts/llama-server.sh build)
model_dir=$(scripts/llama-server.sh model)
target=${CARGO_TARGET_DIR:-$repo/target}

# 2. The root filesystem: minbase, systemd, dbus, and the guide's packages; nothing else.
packages=$(block packages | sed -n 's/^apt-get install //p' | tr ' ' '\n' | grep -v '^-' | grep . | sort | tr '\n' ' ')
[ -n "$packages" ] || die "no package names in the install-check:packages block"
base="systemd dbus"
key=$(printf '%s\n' "$suite minbase" "$base" "$packages" | sha256sum | cut -c1-12)
rootfs=$cache/rootfs-$suite-$key
if [ ! -d "$rootfs" ]; then
  say "making the root filesystem ($suite minbase + $base + $packages) with debootstrap"
  mkdir -p "$cache"
  work=$(mktemp -d "$cache/.rootfs-XXXXXX")
  # shellcheck disable=SC2086 # the names are words
  if ! debootstrap --variant=minbase --include="$(echo $base $packages | tr ' ' ',')" \
    "$suite" "$work/root" "$mirror" >"$work/debootstrap.log" 2>&1; then
    tail -n 20 "$work/debootstrap.log" >&2
    rm -rf "$work"
    die "debootstrap failed"
  fi
  printf '%s\n' "$suite minbase" "$base" "$packages" >"$work/KEY"
  rm -f "$work/debootstrap.log"
  mv "$work" "$rootfs"
  say "cached $rootfs"
fi

# 3. A copy to boot, and the container around it.
run=$(mktemp -d "$cache/.install-check-XXXXXX")
root=$run/root
nspawn_pid=
leader=
ok=0
log=$run/nspawn.log
stop_box() {
  [ -n "$nspawn_pid" ] || return 0
  if kill -0 "$nspawn_pid" 2>/dev/null; then
    kill -TERM "$nspawn_pid" 2>/dev/null || true # nspawn halts the container's systemd
    local end=$((SECONDS + 30))
    while kill -0 "$nspawn_pid" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.2; done
    kill -KILL "$nspawn_pid" 2>/dev/null || true
  fi
  wait "$nspawn_pid" 2>/dev/null || true
  nspawn_pid=
}
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  if [ $ok -ne 1 ] && [ -n "$leader" ] && kill -0 "$leader" 2>/dev/null; then
    echo "install-check: the units' journal, last lines:" >&2
    in_box journalctl -b --no-pager -n 60 -u llama-worker -u inferproxy -u loopd 2>/dev/null |
      sed 's/^/  | /' >&2 || true
    echo "install-check: loopd status:" >&2
    in_box loopd status --socket /run/loopd/loopd.sock 2>&1 | sed 's/^/  | /' >&2 || true
  fi
  stop_box
  if [ $ok -ne 1 ]; then
    for f in "$run"/follow.*; do
      [ -s "$f" ] || continue
      echo "install-check: $(basename "$f"):" >&2
      tail -n 5 "$f" | sed 's/^/  | /' >&2
    done
  fi
  rm -rf "$run"
  [ $ok -eq 1 ] || { [ $status -ne 0 ] || status=1; echo "install-check: FAILED" >&2; }
  exit $status
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
say "copying the root filesystem"
cp -a --reflink=auto "$rootfs/root" "$root"

in_box() {
  nsenter -t "$leader" -a env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 "$@"
}

boot() {
  local binds=(--bind-ro="$repo:/src/boxmaker" --bind-ro="$(dirname "$server")" --bind-ro="$model_dir")
  [ "$target" = "$repo/target" ] || binds+=(--bind-ro="$target:/src/boxmaker/target")
  systemd-nspawn --quiet --register=no --keep-unit --private-network --system-call-filter=bpf \
    --console=passive "${binds[@]}" -D "$root" -b >>"$log" 2>&1 &
  nspawn_pid=$!
  local end=$((SECONDS + 60)) state=""
  leader=
  while :; do
    # The container's systemd: nspawn's child is briefly another process of its own first.
    leader=$(ps -o pid=,comm= --ppid "$nspawn_pid" 2>/dev/null | awk '$2 == "systemd" { print $1; exit }' || true)
    if [ -n "$leader" ]; then
      state=$(in_box systemctl is-system-running 2>/dev/null || true)
      case $state in running | degraded) break ;; esac
    fi
    kill -0 "$nspawn_pid" 2>/dev/null || { tail -n 20 "$log" >&2; die "systemd-nspawn exited while booting"; }
    [ $SECONDS -lt $end ] || { tail -n 20 "$log" >&2; ps -o pid,ppid,stat,wchan:20,args --ppid "$nspawn_pid" -p "$nspawn_pid" >&2; die "the container did not finish booting within 60 s (last state: ${state:-no init yet})"; }
    sleep 0.2
  done
  say "booted: systemd is $state (container init pid $leader)"
}
boot_started=$SECONDS
boot

# 4. The install, the guide's block as written, as root in the checkout.
say "running the guide's install block"
out=$(in_box env BOXMAKER_CACHE="$cache" bash -euo pipefail -c "cd /src/boxmaker; $(block install)" 2>&1) || {
  echo "$out" | tail -n 30 | sed 's/^/  | /' >&2
  die "the install block of $guide exited non-zero"
}
echo "$out" | sed 's/^/  | /'

say "install block ran in $((SECONDS - boot_started)) s (enable --now returns when loopd is ready)"

# 5. Under systemd.
for u in llama-worker inferproxy loopd; do
  s=$(in_box systemctl is-active "$u" || true)
  [ "$s" = active ] || die "$u.service is $s, not active"
done
say "llama-worker, inferproxy, loopd: active"
journal=$(in_box journalctl -b -u loopd -o cat --no-pager)
passed=$(echo "$journal" | grep -n '^ok   cache' | head -n 1 | cut -d: -f1)
started=$(echo "$journal" | grep -n '^Started loopd' | head -n 1 | cut -d: -f1)
[ -n "$passed" ] || die "no self-test line 'ok   cache' in loopd's journal: $(echo "$journal" | tail -n 5)"
[ -n "$started" ] || die "no 'Started loopd' in loopd's journal: $(echo "$journal" | tail -n 5)"
[ "$passed" -lt "$started" ] || die "loopd was started (line $started) before its self-test passed (line $passed)"
say "loopd's journal: the self-test passed (line $passed) before systemd's Started (line $started)"

sock=/run/loopd/loopd.sock
# A short answer: this checks the path, not the model.
short="Answer with one word: is 7 greater than 3?"
# One that streams for a while (about 300 tokens) without repeating a line (loop detection).
long="List the numbers from 1 to 120 in digits, separated by commas, on one line."
submit() { # [as user] prompt max-tokens -> the id
  local who=() out
  [ "$1" = as ] && { who=(runuser -u "$2" --); shift 2; }
  out=$(in_box "${who[@]}" loopd submit --socket "$sock" --budget 1 --max-tokens "${2:-32}" "$1" 2>&1) || die "loopd submit ${who[*]} exited non-zero: $out"
  echo "$out" | grep -o 'req-[0-9]*' | head -n 1
}
# The result's outcome, fail_reason and detail on one line (fetches it: once).
result() { # id [runuser user]
  local who=()
  [ $# -gt 1 ] && who=(runuser -u "$2" --)
  in_box "${who[@]}" loopd result --socket "$sock" --wait 300 --json "$1" | python3 -c '
import json, sys
r = json.load(sys.stdin)["result"]
print(r.get("outcome"), r.get("fail_reason"), r.get("detail"), sep="\t")'
}
expect_result() { # id want-outcome want-reason [user]
  local got
  got=$(result "$1" ${4:+"$4"}) || die "loopd result $1 failed: $got"
  [ "$(echo "$got" | cut -f1,2)" = "$2	$3" ] || die "request $1: expected $2/$3, got: $got"
  echo "$got"
}
id=$(submit "$short")
expect_result "$id" completed None >/dev/null
say "request $id completed as root"
id=$(submit as loopd "$short")
expect_result "$id" completed None loopd >/dev/null
say "request $id completed as the user loopd"
if out=$(in_box runuser -u nobody -- loopd status --socket "$sock" 2>&1); then
  die "the user nobody reached loopd's socket: $out"
fi
say "refused for the user nobody: $(echo "$out" | tail -n 1)"

# The table "What the daemons make themselves": the sockets' modes and owners, the folders'.
while IFS='|' read -r _ path what how _; do
  path=$(echo "$path" | sed -n 's/^ *`\([^`{]*\)`.*/\1/p')
  case $path in /run/*.sock) ;; *) continue ;; esac
  unit=$(echo "$path" | cut -d/ -f3)
  user=$(sed -n 's/^User=//p' "docs/$unit.service")
  mode=$(echo "$what" | grep -o '0[0-7][0-7][0-7]' | head -n 1)
  dir_mode=$(echo "$how" | grep -o '0[0-7][0-7][0-7]' | head -n 1 || true)
  got=$(in_box stat -c '%U:%G %a' "$path") || die "no $path"
  [ "$got" = "$user:boxmaker ${mode#0}" ] || die "$path is $got, the guide says $user:boxmaker $mode"
  dir=$(in_box stat -c '%U:%G %a' "$(dirname "$path")")
  [ -z "$dir_mode" ] || [ "${dir#* }" = "${dir_mode#0}" ] || die "$(dirname "$path") is $dir, the guide says $dir_mode"
  say "$path: $got, in $(dirname "$path") $dir"
done < <(grep '^| `/run/' "$guide")
for d in /var/lib/loopd:700 /var/log/llama-worker:750; do
  got=$(in_box stat -c %a "${d%:*}")
  [ "$got" = "${d#*:}" ] || die "${d%:*} is $got, not ${d#*:}"
done

# systemd-analyze security on the running system, against the guide's table.
for u in inferproxy llama-worker loopd; do
  figure=$(in_box systemd-analyze security "$u.service" 2>&1 | sed -n 's/.*Overall exposure level.*: \([0-9]*\.[0-9]\) .*/\1/p')
  row=$(grep "^| \`$u.service\` |" "$guide" | cut -d'|' -f4 | tr -d ' ')
  [ -n "$figure" ] || die "no exposure level for $u from systemd-analyze security"
  [ "$figure" = "$row" ] || die "$u.service: systemd-analyze security (online) says $figure, the guide's table $row"
  say "systemd-analyze security $u.service: $figure, as the guide says"
done

# 6. What survives what. A request that streams for a while, followed from its start.
follow_long() { # sets id and follower (its events go to $run/follow.$id)
  id=$(submit "$long" 400)
  in_box loopd follow --socket "$sock" "$id" >"$run/follow.$id" 2>&1 &
  follower=$!
  local end=$((SECONDS + 60))
  # Its first bytes: the answer is streaming.
  until [ -s "$run/follow.$id" ]; do
    [ $SECONDS -lt $end ] || die "request $id streamed nothing within 60 s (follow: $(tail -n 2 "$run/follow.$id"))"
    sleep 0.1
  done
}
# The end of the followed request $id: the follower's end line (`req-N: completed (stop) ...`,
# `req-N: failed: REASON: detail`), or when the follower lost loopd (its restart) `loopd
# result`. As result's three fields.
followed() {
  local end=$((SECONDS + 300)) line
  while kill -0 "$follower" 2>/dev/null; do
    [ $SECONDS -lt $end ] || die "request $id: its follower did not end within 300 s ($(tail -n 1 "$run/follow.$id"))"
    sleep 0.2
  done
  line=$(grep "^$id: \(completed\|failed: \)" "$run/follow.$id" | tail -n 1 || true)
  line=${line#"$id: "}
  case $line in
    completed*) printf 'completed\tNone\tNone\n' ;;
    failed:*)
      line=${line#failed: }
      printf 'failed\t%s\t%s\n' "${line%%: *}" "${line#*: }"
      ;;
    *) result "$id" ;;
  esac
}
expect_followed() { # want-outcome want-reason
  local got
  got=$(followed)
  [ "$(echo "$got" | cut -f1,2)" = "$1	$2" ] || die "request $id: expected $1/$2, got: $got (follow: $(tail -n 2 "$run/follow.$id"))"
  echo "$got"
}
main_pid() { in_box systemctl show -p MainPID --value "$1"; }
# loopd's "host local is ready" lines this boot: loopd admits again once its watch has said so.
ready_lines() { in_box journalctl -b -u loopd -o cat --no-pager | grep -c 'host local is ready' || true; }
wait_ready() { # deadline in s, ready_lines before the event: the worker ready and loopd seeing it
  local end=$((SECONDS + $1)) st=""
  while :; do
    st=$(in_box llama-worker status --socket /run/llama-worker/status.sock 2>&1 | grep -o '"state":"[a-z_]*"' || true)
    [ "$st" = '"state":"ready"' ] && [ "$(ready_lines)" -gt "$2" ] && break
    [ $SECONDS -lt $end ] || die "not ready within $1 s (worker: ${st:-no answer}; loopd: $(in_box systemctl is-active loopd), its ready lines $(ready_lines), $2 before)"
    sleep 0.5
  done
}

# Each row below needs a request still streaming when its fault comes, so the
# model's sampling is pinned from here on (temperature 0 and a seed in loopd's config, the one
# change to the guide's files): then the long prompt streams its full 400 tokens, one line of
# numbers, every time (unpinned, the small model stopped after 4 tokens once, repeated a line
# once).
before=$(ready_lines)
in_box bash -c 'printf "\n[sampling]\ntemperature = 0.0\nseed = 42\n" >>/etc/loopd/loopd.toml'
in_box systemctl restart loopd
wait_ready 120 "$before"
say "sampling pinned in /etc/loopd/loopd.toml (temperature 0, seed 42); loopd restarted"
pid=$(main_pid loopd)
follow_long
in_box systemctl restart inferproxy
# It ends by itself: completed, or loop_detected should the model repeat a line (it did once
# before its sampling was pinned); never cancelled or cut by the restart.
got=$(followed)
case $(echo "$got" | cut -f1,2) in
  "completed	None" | "failed	loop_detected") ;;
  *) die "request $id on systemctl restart inferproxy: $got (follow: $(tail -n 2 "$run/follow.$id"))" ;;
esac
[ "$(main_pid loopd)" = "$pid" ] || die "loopd's pid changed from $pid to $(main_pid loopd) on systemctl restart inferproxy"
say "systemctl restart inferproxy under a streaming request: it ended $(echo "$got" | cut -f1,2 | tr '\t' ' '), loopd kept pid $pid"

kept=$(submit "$short")
end=$((SECONDS + 120))
until [ "$(in_box sqlite3 -readonly /var/lib/loopd/loopd.db "SELECT state FROM requests WHERE id = ${kept#req-}")" = ended ]; do
  [ $SECONDS -lt $end ] || die "request $kept did not end within 120 s"
  sleep 0.2
done
out=$(in_box bash -c "$(block queries | sed "s/WHERE id = 1/WHERE id = ${kept#req-}/")" 2>&1) ||
  die "the guide's queries failed on the live store: $out"
say "the guide's queries on the live store (sqlite3 -readonly): $(echo "$out" | tr '\n' ' ' | cut -c1-100)"
follow_long
in_box systemctl restart loopd
got=$(expect_followed failed cancelled)
echo "$got" | grep -q 'loopd serve was stopped' || die "request $id's detail does not name the stop: $got"
expect_result "$kept" completed None >/dev/null
say "systemctl restart loopd: $id cancelled ($(echo "$got" | cut -f3)), $kept's result kept"

follow_long
# The model instance: a llama-server whose parent is the router (a llama-server too). Read from
# /proc, as the minimal system has no procps (no pgrep, ps or /bin/kill).
llama_servers='for d in /proc/[0-9]*; do
  [ "$(cat "$d/comm" 2>/dev/null)" = llama-server ] || continue
  echo "${d#/proc/} $(sed -n "s/^PPid:\t//p" "$d/status")"
done'
instance=$(in_box bash -c "$llama_servers" | while read -r p pp; do
  in_box bash -c "[ \"\$(cat /proc/$pp/comm 2>/dev/null)\" = llama-server ]" && echo "$p"
done | head -n 1)
[ -n "$instance" ] || die "no model instance (a llama-server child of the router): $(in_box bash -c "$llama_servers" | tr '\n' ' ')"
before=$(ready_lines)
in_box bash -c "kill -KILL $instance"
expect_followed failed server_died >/dev/null
wait_ready 120 "$before"
id=$(submit "$short")
expect_result "$id" completed None >/dev/null
say "SIGKILL of the model instance ($instance): server_died, then healed ($id completed)"

follow_long
before=$(ready_lines)
in_box systemctl restart llama-worker
got=$(followed)
case $(echo "$got" | cut -f2) in worker_stopped | host_lost | worker_restarted) ;; *) die "request $id on systemctl restart llama-worker: $got" ;; esac
wait_ready 120 "$before"
# The worker stopped its server itself: systemd found nothing of it left to kill.
left=$(in_box journalctl -b -u llama-worker -o cat --no-pager | grep -E 'left-over process|Killing process' || true)
[ -z "$left" ] || die "systemd killed what llama-worker left behind at its restart: $left"
say "systemctl restart llama-worker: request $id ended $(echo "$got" | cut -f2), the model back"

kept=$(submit "$short")
end=$((SECONDS + 120))
until [ "$(in_box sqlite3 -readonly /var/lib/loopd/loopd.db "SELECT state FROM requests WHERE id = ${kept#req-}")" = ended ]; do
  [ $SECONDS -lt $end ] || die "request $kept did not end within 120 s"
  sleep 0.2
done
say "rebooting the container"
in_box systemctl reboot || true
end=$((SECONDS + 60))
while kill -0 "$nspawn_pid" 2>/dev/null; do
  [ $SECONDS -lt $end ] || die "the container did not go down within 60 s of systemctl reboot"
  sleep 0.2
done
rc=0
wait "$nspawn_pid" || rc=$?
[ $rc -eq 133 ] || die "systemd-nspawn exited $rc on the container's reboot, not 133"
nspawn_pid=
boot
end=$((SECONDS + 300))
until [ "$(in_box systemctl is-active loopd || true)" = active ]; do
  [ $SECONDS -lt $end ] || die "loopd not active within 300 s of the reboot ($(in_box systemctl is-active loopd || true))"
  sleep 0.5
done
wait_ready 120 0
expect_result "$kept" completed None >/dev/null
id=$(submit "$short")
expect_result "$id" completed None >/dev/null
say "reboot: the three units came back, $kept's result kept, $id completed"

# A failed start, as on a system without llama-server's libraries: the worker gives up after
# its restarts, check-config names the library, loopd refuses to start; the guide's one
# command after the fix brings the model back and loopd follows by itself.
gomp=$(in_box bash -c 'ls /usr/lib/*/libgomp.so.1' | head -n 1)
[ -n "$gomp" ] || die "no libgomp.so.1 in the container"
in_box mv "$gomp" "$gomp.away"
in_box systemctl restart llama-worker
end=$((SECONDS + 120))
st=""
until [ "$st" = '"state":"failed"' ]; do
  [ $SECONDS -lt $end ] || die "llama-worker not failed within 120 s without libgomp (state: ${st:-no answer})"
  sleep 0.5
  st=$(in_box llama-worker status --socket /run/llama-worker/status.sock 2>&1 | grep -o '"state":"[a-z_]*"' || true)
done
out=$(in_box llama-worker check-config --config /etc/llama-worker/llama-worker.toml 2>&1) &&
  die "check-config passed without libgomp: $out"
echo "$out" | grep -q 'libgomp.so.1' || die "check-config does not name libgomp.so.1: $out"
in_box systemctl restart loopd || true
end=$((SECONDS + 60))
until in_box journalctl -b -u loopd -o cat --no-pager --since "-60s" | grep -q 'refusing to start'; do
  [ $SECONDS -lt $end ] || die "loopd did not refuse to start within 60 s (is-active: $(in_box systemctl is-active loopd || true))"
  sleep 0.5
done
[ "$(in_box systemctl is-active loopd || true)" != active ] || die "loopd is active beside a failed worker"
say "without libgomp: llama-worker failed, check-config named the library, loopd refused to start"
in_box mv "$gomp.away" "$gomp"
before=$(ready_lines)
in_box bash -euo pipefail -c "$(block recover)"
end=$((SECONDS + 180))
until [ "$(in_box systemctl is-active loopd || true)" = active ]; do
  [ $SECONDS -lt $end ] || die "loopd not active within 180 s of the guide's recovery ($(in_box systemctl is-active loopd || true))"
  sleep 0.5
done
wait_ready 120 "$before"
id=$(submit "$short")
expect_result "$id" completed None >/dev/null
say "the guide's recovery ($(block recover)): loopd followed by itself, $id completed"

ok=1
say "passed in $((SECONDS - start_time)) s"
