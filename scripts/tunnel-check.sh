#!/usr/bin/env bash
# make tunnel-check: docs/loopd-tunnel@.service's own ssh command line (its ExecStart=, with the
# values systemd and the EnvironmentFile would put in) against a user-mode sshd on 127.0.0.1
# that runs docs/loopd-tunnel.sshd.conf, on this box (issue 33 item 2). Stand-ins for the GPU
# host: an HTTP server on a loopback port (llama-server) and a 0600 line server on a Unix
# socket (llama-worker's status socket); scripts/tunnel-peers.py is both ends. It checks:
#   - ssh -f returns only once both local sockets accept; they are 0660 and the process's
#     group, so another user of that group connects and a user outside it does not;
#   - exact bytes both ways on both sockets (a 70 KiB binary request; a hello and a line);
#   - the GPU host's server down: a connect is accepted, then closed with no byte;
#   - the sshd settings: a -R is refused (PermitListen none), a command gets ForceCommand's
#     nologin, and a -L to another loopback port opens (what OpenSSH cannot refuse while it
#     forwards to Unix sockets: docs/fleet.md's firewall rule is for that); and the client
#     refuses a host whose key is not known_hosts' line for the alias;
#   - ssh killed (a partition): an open connection ends and new connects are refused within
#     1 s; the same line started again serves again (StreamLocalBindUnlink);
#   - sshd's session stopped (a black hole): the keep-alives end ssh within
#     ServerAliveInterval x (ServerAliveCountMax + 1) + 1 s, at most 5 s, then connects are
#     refused.
# Every wait has a deadline and says what it saw last; everything it starts is stopped on exit,
# failure included, and its temporary folder removed. About 10 s. Installs openssh-server and
# openssh-client (apt) when sshd is missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source-path=SCRIPTDIR source=tunnel.sh
. "$root/scripts/tunnel.sh"

started_ms=$(date +%s%3N)
now_ms() { date +%s%3N; }
ok() { echo "tunnel-check: ok: $*"; }
die() { echo "tunnel-check: FAIL: $*" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/boxmaker-tunnel-XXXXXX")
stand_ins=()
hold_pid=
cleanup() {
  local rc=$? p left
  for p in "${stand_ins[@]}" $hold_pid; do kill "$p" 2>/dev/null || true; done
  tunnel_stop "$tmp/sshd"
  wait 2>/dev/null || true
  left=$(pgrep -f -- "$tmp" || true)
  rm -rf "$tmp"
  if [ -n "$left" ]; then
    echo "tunnel-check: FAIL: still running after the cleanup: $left" >&2
    rc=1
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The probes also run as another user: a copy it can read, in folders it can pass through.
chmod 0711 "$tmp"
cp "$root/scripts/tunnel-peers.py" "$tmp/peers.py"
chmod 0644 "$tmp/peers.py"
peers() { python3 "$tmp/peers.py" "$@"; }

# Runs CMD until it succeeds, for SECONDS at most; then fails with DESC and CMD's last output.
wait_until() {
  local desc=$1 seconds=$2 deadline out
  shift 2
  deadline=$(($(now_ms) + seconds * 1000))
  until out=$("$@" 2>&1); do
    [ "$(now_ms)" -lt $deadline ] || die "$desc: not within $seconds s; last: ${out:-nothing}"
    sleep 0.05
  done
}

# A probe that must pass; its line goes into the ok line.
expect() {
  local what=$1 out
  shift
  out=$(peers "$@" 2>&1) || die "$what: $out"
  ok "$what: $out"
}

# Waits for PID to be gone (or a zombie of someone else's), SECONDS at most; prints the ms.
wait_gone() {
  local pid=$1 seconds=$2 t0 deadline state
  t0=$(now_ms)
  deadline=$((t0 + seconds * 1000))
  while state=$(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null) && [ "$state" != Z ]; do
    [ "$(now_ms)" -lt $deadline ] || die "process $pid still running (state $state) after $seconds s"
    sleep 0.02
  done
  echo $(($(now_ms) - t0))
}

# --- the GPU host: stand-ins, and sshd as docs/loopd-tunnel.sshd.conf ---------------------------
tunnel_install || die "could not install openssh-server"
remote=$tmp/remote
mkdir -m 0700 "$remote"
infer_port=$(tunnel_free_port)
start_http() {
  python3 "$tmp/peers.py" serve-http "$infer_port" &
  stand_ins+=($!)
  http_pid=$!
  # shellcheck disable=SC2016 # $0 is the inner shell's
  wait_until "llama-server stand-in on 127.0.0.1:$infer_port" 5 \
    timeout 1 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0"' "$infer_port"
}
start_http
python3 "$tmp/peers.py" serve-lines "$remote/status.sock" &
stand_ins+=($!)
wait_until "worker stand-in on $remote/status.sock" 5 test -S "$remote/status.sock"
[ "$(stat -c %a "$remote/status.sock")" = 600 ] || die "the worker stand-in's socket is not 0600"

mkdir "$tmp/sshd"
tunnel_sshd_start "$tmp/sshd" || die "sshd did not start"
sshd_pid=$(cat "$tmp/sshd/sshd.pid")
sshd_port=$(cat "$tmp/sshd/sshd.port")
ok "sshd $(/usr/sbin/sshd -V 2>&1 | cut -d, -f1) on 127.0.0.1:$sshd_port with docs/loopd-tunnel.sshd.conf (Match User $(id -un), key from=\"127.0.0.1\")"

# --- the agent box: the unit's ssh line ----------------------------------------------------
# As systemd makes RuntimeDirectory=loopd-tunnel/%i: parents 0755, the folder 0750.
run=$tmp/run/loopd-tunnel/$tunnel_alias
mkdir -p "$run"
chmod 0755 "$tmp/run" "$tmp/run/loopd-tunnel"
chmod 0750 "$run"
infer=$run/infer.sock
status=$run/status.sock
words=$(tunnel_unit_argv "$tunnel_alias" "$tmp/sshd" "$tmp/sshd/known_hosts" "$run" "$sshd_port" \
  "$infer_port" "$remote/status.sock" "$(id -un)@127.0.0.1") || die "cannot read the unit's ExecStart="
mapfile -t argv <<<"$words"

# Starts the unit's line; prints "PID MS".
start_tunnel() {
  local t0 pid
  t0=$(now_ms)
  pid=$(tunnel_ssh_start "$tmp/sshd" "${argv[@]}") || die "the unit's ssh line failed"
  echo "$pid $(($(now_ms) - t0))"
}
read -r ssh_pid ms < <(start_tunnel)
[ -n "$ssh_pid" ] || die "the unit's ssh line did not start"
ok "the unit's ssh line returned after $ms ms, ssh $ssh_pid left running: $(printf '%s ' "${argv[@]}")"
expect "infer.sock -> 127.0.0.1:$infer_port, at once" http "$infer"
expect "status.sock -> the 0600 status socket" lines "$status"

modes=$(stat -c '%a %G' "$infer" "$status" | sort -u)
[ "$modes" = "660 $(id -gn)" ] || die "local sockets are '$modes', wanted 660 and group $(id -gn) (StreamLocalBindMask=0117)"
ok "both local sockets are 0660, group $(id -gn) (the unit's Group=), in a 0750 folder"
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
  as_group=(setpriv --reuid=65534 --regid="$(id -g)" --clear-groups)
  as_other=(setpriv --reuid=65534 --regid=65534 --clear-groups)
  out=$("${as_group[@]}" /usr/bin/python3 "$tmp/peers.py" lines "$status" 2>&1) ||
    die "uid 65534 in the group cannot use status.sock: $out"
  ok "another user in the group (uid 65534 gid $(id -g)) connects: $out"
  out=$("${as_other[@]}" /usr/bin/python3 "$tmp/peers.py" denied "$infer" 2>&1) ||
    die "a user outside the group got in: $out"
  ok "a user outside the group is refused: $out"
else
  echo "tunnel-check: skipped: connecting as another user needs root and setpriv"
fi

# --- the GPU host's server down -------------------------------------------------------------
kill "$http_pid"
wait "$http_pid" 2>/dev/null || true
expect "llama-server stand-in stopped: infer.sock" closed "$infer" 2000
start_http
expect "llama-server stand-in back: infer.sock" http "$infer"

# --- what sshd refuses, and what it cannot ----------------------------------------------------
# The unit's line with other forwards: LOCAL=REMOTE.. replace its two -L.
variant() {
  local words
  words=$(tunnel_pairs_argv "$tmp/sshd" "$@") || die "cannot build a variant of the unit's line"
  printf '%s\n' "$words"
}
mapfile -t remote_fwd < <(variant "$tmp/other.sock=$remote/status.sock")
[ ${#remote_fwd[@]} -gt 1 ] || die "cannot build a variant of the unit's line"
remote_fwd=("${remote_fwd[@]:0:${#remote_fwd[@]}-1}" -R "127.0.0.1:$(tunnel_free_port):127.0.0.1:$infer_port" "${remote_fwd[-1]}")
if out=$(timeout 10 "${remote_fwd[@]}" </dev/null 2>&1); then
  die "a -R was allowed: $out"
fi
grep -q 'remote port forwarding failed' <<<"$out" || die "a -R failed, but not as refused: $out"
ok "-R refused (PermitListen none), ssh exits: $(grep 'remote port forwarding failed' <<<"$out" | head -n 1)"
rm -f "$tmp/other.sock"

mapfile -t command < <(variant | grep -vx -e -N -e -f)
[ ${#command[@]} -gt 1 ] || die "cannot build the unit's line without forwards"
if out=$(timeout 10 "${command[@]}" echo ran 2>&1 </dev/null); then
  die "a command ran: $out"
fi
if grep -qx ran <<<"$out"; then die "a command ran: $out"; fi
ok "a command gets ForceCommand's nologin: ${out//$'\n'/ }"

ssh-keygen -q -t ed25519 -N '' -f "$tmp/stranger"
echo "$tunnel_alias $(cut -d' ' -f1,2 "$tmp/stranger.pub")" >"$tmp/stranger_known_hosts"
words=$(tunnel_unit_argv "$tunnel_alias" "$tmp/sshd" "$tmp/stranger_known_hosts" "$tmp/run" "$sshd_port" \
  "$infer_port" "$remote/status.sock" "$(id -un)@127.0.0.1") || die "cannot read the unit's ExecStart="
mapfile -t stranger <<<"$words"
if out=$(timeout 10 "${stranger[@]}" </dev/null 2>&1); then
  die "ssh logged in to a host whose key known_hosts does not hold: $out"
fi
grep -q 'Host key verification failed' <<<"$out" || die "a wrong host key failed, but not as refused: $out"
ok "a host key other than known_hosts' line for the alias: ssh exits: $(grep 'Host key verification failed' <<<"$out")"

mapfile -t other < <(variant "$tmp/other.sock=127.0.0.1:$sshd_port")
[ ${#other[@]} -gt 1 ] || die "cannot build a variant of the unit's line"
other_pid=$(tunnel_ssh_start "$tmp/sshd" "${other[@]}") || die "ssh with a -L to another port failed"
expect "not refused by sshd (docs/fleet.md's firewall rule is for this): a -L to 127.0.0.1:$sshd_port" banner "$tmp/other.sock"
kill "$other_pid"
wait_gone "$other_pid" 2 >/dev/null
rm -f "$tmp/other.sock"

# --- partition: ssh killed, then started again -------------------------------------------------
peers hold "$status" 3000 >"$tmp/hold.out" 2>&1 &
hold_pid=$!
wait_until "a held connection on status.sock" 5 grep -q '^held$' "$tmp/hold.out"
kill -KILL "$ssh_pid"
t0=$(now_ms)
wait "$hold_pid" || die "the connection open at the kill: $(tail -n 1 "$tmp/hold.out")"
ok "ssh killed (a partition): the open status connection ended, $(tail -n 1 "$tmp/hold.out" | cut -d' ' -f1) $(($(now_ms) - t0)) ms after the kill"
hold_pid=
if [ ! -S "$infer" ] || [ ! -S "$status" ]; then
  die "the killed ssh's socket files are gone, so the rejoin proves nothing"
fi
expect "ssh killed: a new connect to infer.sock (its stale file left)" refused "$infer" 1000
expect "ssh killed: a new connect to status.sock" refused "$status" 1000

read -r ssh_pid ms < <(start_tunnel)
[ -n "$ssh_pid" ] || die "the unit's ssh line did not start again"
ok "the same line again (the stale files in place) returned after $ms ms, ssh $ssh_pid"
expect "rejoined: infer.sock" http "$infer"
expect "rejoined: status.sock" lines "$status"

# --- black hole: sshd's session stopped; the keep-alives end ssh ------------------------------
alive=$(sed -n 's/.*-o ServerAliveInterval=\([0-9]*\) .*/\1/p' <<<"${argv[*]} ")
count=$(sed -n 's/.*-o ServerAliveCountMax=\([0-9]*\) .*/\1/p' <<<"${argv[*]} ")
if [ -z "$alive" ] || [ -z "$count" ]; then
  die "the unit's line sets no ServerAliveInterval/ServerAliveCountMax"
fi
bound_ms=$(((alive * (count + 1) + 1) * 1000))
# loopd calls a host lost after 3 s of watch silence; the tunnel must not outlive that by much.
[ $bound_ms -le 5000 ] || die "the unit's keep-alives (ServerAliveInterval=$alive, ServerAliveCountMax=$count) let a black-holed ssh live $bound_ms ms, more than 5000"
mapfile -t sessions < <(tunnel_descendants "$sshd_pid")
[ ${#sessions[@]} -gt 0 ] || die "sshd $sshd_pid has no session to stop"
kill -STOP "${sessions[@]}"
# The keep-alives' own bound, plus 3 s for a loaded box's late timers (a behaviour check, not a
# measurement: the measured figure is printed).
limit_ms=$((bound_ms + 3000))
ms=$(wait_gone "$ssh_pid" $((limit_ms / 1000 + 5)))
[ "$ms" -le $limit_ms ] || die "ssh ended $ms ms after its server stopped answering, more than $limit_ms ms"
ok "sshd's session stopped (a black hole): ssh exited after $ms ms (bound $bound_ms ms: ServerAliveInterval=$alive, ServerAliveCountMax=$count)"
expect "black hole: a new connect to infer.sock" refused "$infer" 1000
kill -CONT "${sessions[@]}" 2>/dev/null || true
kill "${sessions[@]}" 2>/dev/null || true
read -r ssh_pid ms < <(start_tunnel)
[ -n "$ssh_pid" ] || die "the unit's ssh line did not start after the black hole"
expect "rejoined after the black hole: status.sock" lines "$status"

ok "run time $((($(now_ms) - started_ms) / 1000)).$(((($(now_ms) - started_ms) % 1000) / 100)) s"
