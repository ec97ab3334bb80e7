#!/usr/bin/env bash
# A user-mode sshd on 127.0.0.1 and ssh forwards through it, run with the ssh command line of
# docs/loopd-tunnel@.service and the sshd settings of docs/loopd-tunnel.sshd.conf, for the tests
# that need the real tunnel on one box (issue 33; scripts/tunnel-check.sh uses the functions).
#
#   scripts/tunnel.sh start DIR LOCAL=REMOTE [LOCAL=REMOTE ...]
#     The first start in DIR (a new or empty folder) makes a host key and a client key there
#     and starts sshd on a free loopback port, as this user, with the example's settings, and
#     prints "sshd PID PORT". Every start then
#     runs one ssh with the unit's options that forwards each LOCAL Unix socket to REMOTE
#     (HOST:PORT, or the path of a Unix socket), and prints "ssh PID" once the sockets accept
#     (the unit's ssh -f returns only then).
#     A partition: kill -KILL the ssh; a black hole: kill -STOP it; rejoining: start again with
#     the same pairs (the unit's StreamLocalBindUnlink replaces the socket files left behind).
#   scripts/tunnel.sh stop DIR
#     stops every ssh started in DIR, the sshd and its sessions (stopped ones too), and removes
#     DIR. The LOCAL socket files stay (ssh leaves them): keep them in a folder of your own.
# Logs: DIR/sshd.log, DIR/ssh.log. Installs openssh-server and openssh-client (apt) when sshd
# is missing. Sourced, it only defines the functions.

tunnel_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tunnel_unit=$tunnel_root/docs/loopd-tunnel@.service
tunnel_sshd_conf=$tunnel_root/docs/loopd-tunnel.sshd.conf
# The instance name the client keys known_hosts by (the unit's HostKeyAlias=%i).
tunnel_alias=tunnel

tunnel_die() { echo "tunnel: $*" >&2; return 1; }

# sshd, ssh and ssh-keygen, from apt when sshd is missing. On a machine that runs systemd, the
# package starts its own ssh.service as well (a container's policy-rc.d usually denies that).
tunnel_install() {
  [ -x /usr/sbin/sshd ] && command -v ssh >/dev/null && command -v ssh-keygen >/dev/null && return 0
  local sudo=()
  [ "$(id -u)" = 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq >&2 &&
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      openssh-server openssh-client >/dev/null
}

tunnel_free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The unit's ExecStart=, one word per line, with the values systemd would put in: INSTANCE for
# %i, CRED_DIR for %d (LoadCredential's folder, holding "key"), KNOWN_HOSTS for
# /etc/loopd/tunnel/known_hosts, RUN_DIR for /run/loopd-tunnel/%i, and the EnvironmentFile's
# SSH_PORT INFER_PORT WORKER_SOCKET DESTINATION. Anything left that systemd would expand fails.
tunnel_unit_argv() {
  local instance=$1 cred_dir=$2 known_hosts=$3 run_dir=$4 ssh_port=$5 infer_port=$6 worker_socket=$7
  local destination=$8 line
  line=$(awk '/^ExecStart=/ { on = 1; sub(/^ExecStart=/, "") }
              on { more = sub(/\\$/, ""); printf "%s ", $0; if (!more) exit }' "$tunnel_unit")
  [ -n "$line" ] || { tunnel_die "no ExecStart= in $tunnel_unit"; return 1; }
  case $line in *\"* | *\'*) tunnel_die "ExecStart= quotes words; split it as systemd does"; return 1 ;; esac
  line=${line//"/run/loopd-tunnel/%i"/"$run_dir"}
  line=${line//"/etc/loopd/tunnel/known_hosts"/"$known_hosts"}
  line=${line//"%d"/"$cred_dir"}
  line=${line//"%i"/"$instance"}
  # shellcheck disable=SC2016 # the unit's ${VAR} text, replaced
  line=${line//'${SSH_PORT}'/"$ssh_port"}
  # shellcheck disable=SC2016
  line=${line//'${INFER_PORT}'/"$infer_port"}
  # shellcheck disable=SC2016
  line=${line//'${WORKER_SOCKET}'/"$worker_socket"}
  # shellcheck disable=SC2016
  line=${line//'${DESTINATION}'/"$destination"}
  case $line in *%* | *\$*) tunnel_die "ExecStart= has a specifier or variable this script does not fill: $line"; return 1 ;; esac
  local words
  read -ra words <<<"$line"
  printf '%s\n' "${words[@]}"
}

# The pid of the ssh whose command line is exactly ARGV, not one of DIR/ssh.pids (a rejoin runs
# the same line again). ssh -f forked it, so it is nobody's child here.
tunnel_ssh_pid() {
  local dir=$1 p comm found=
  shift
  for p in /proc/[0-9]*; do
    { read -r comm <"$p/comm"; } 2>/dev/null || continue
    [ "$comm" = ssh ] || continue
    grep -qx "${p#/proc/}" "$dir/ssh.pids" 2>/dev/null && continue
    cmp -s <(printf '%s\0' "$@") "$p/cmdline" 2>/dev/null && found=${p#/proc/}
  done
  [ -n "$found" ] || { tunnel_die "no ssh with the command line it was started with (DIR/ssh.log: $(tail -n 3 "$dir/ssh.log" | tr '\n' ' '))"; return 1; }
  echo "$found"
}

# Keys, the configuration and sshd on a free loopback port (DIR/sshd.pid, DIR/sshd.port), with
# the example's settings for this user.
tunnel_sshd_start() {
  local dir=$1 user port pid options deadline conf=$1/sshd_config.d/loopd-tunnel.conf
  user=$(id -un)
  tunnel_install || { tunnel_die "could not install openssh-server"; return 1; }
  mkdir -p "$dir/sshd_config.d"
  # Root's sshd separates privileges into /run/sshd, which the package makes only at boot.
  if [ "$(id -u)" = 0 ] && [ ! -d /run/sshd ]; then
    mkdir -m 0755 /run/sshd && touch "$dir/made-run-sshd"
  fi
  ssh-keygen -q -t ed25519 -N '' -C tunnel-host -f "$dir/host_key"
  ssh-keygen -q -t ed25519 -N '' -C tunnel-client -f "$dir/key"
  echo "$tunnel_alias $(cut -d' ' -f1,2 "$dir/host_key.pub")" >"$dir/known_hosts"
  # The authorized key's options as the example gives them, from this address.
  options=$(sed -n 's/^#   \(restrict,[^ ]*\) ssh-ed25519 .*/\1/p' "$tunnel_sshd_conf")
  case $options in *'from="192.0.2.5"'*) ;; *) tunnel_die "no authorized_keys example line with from=\"192.0.2.5\" in $tunnel_sshd_conf"; return 1 ;; esac
  echo "${options/'from="192.0.2.5"'/'from="127.0.0.1"'} $(cut -d' ' -f1,2 "$dir/key.pub") tunnel-client" >"$dir/authorized_keys"
  # The example for this user and its keys file; each replacement must take.
  sed -e "s/^Match User loopd-tunnel\$/Match User $user/" \
    -e "s|AuthorizedKeysFile /etc/ssh/authorized_keys/%u\$|AuthorizedKeysFile $dir/authorized_keys|" \
    "$tunnel_sshd_conf" >"$conf"
  if ! grep -q "^Match User $user\$" "$conf" || ! grep -q "AuthorizedKeysFile $dir/authorized_keys\$" "$conf"; then
    tunnel_die "$tunnel_sshd_conf no longer has the lines this script adapts"
    return 1
  fi
  # As Debian's sshd_config: the drop-ins first, then the host's own settings.
  cat >"$dir/sshd_config" <<EOF
Include $dir/sshd_config.d/*.conf
ListenAddress 127.0.0.1
HostKey $dir/host_key
PidFile none
UsePAM no
# Only for this throwaway sshd: the sandbox that runs the tests may be root.
PermitRootLogin prohibit-password
# The keys live under /tmp (mode 1777), which StrictModes refuses.
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
LogLevel VERBOSE
EOF
  /usr/sbin/sshd -t -f "$dir/sshd_config" || { tunnel_die "sshd -t refuses $dir/sshd_config"; return 1; }
  port=$(tunnel_free_port)
  /usr/sbin/sshd -D -E "$dir/sshd.log" -f "$dir/sshd_config" -p "$port" </dev/null >/dev/null 2>&1 &
  pid=$!
  echo "$pid" >"$dir/sshd.pid"
  echo "$port" >"$dir/sshd.port"
  deadline=$((SECONDS + 5))
  # shellcheck disable=SC2016 # $0 is the inner shell's
  until timeout 1 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0" && head -c 7 <&3' "$port" 2>/dev/null | grep -q '^SSH-2.0'; do
    kill -0 "$pid" 2>/dev/null || { tunnel_die "sshd exited: $(tail -n 3 "$dir/sshd.log" | tr '\n' ' ')"; return 1; }
    [ $SECONDS -lt $deadline ] || { tunnel_die "sshd on 127.0.0.1:$port gave no SSH banner in 5 s; log: $(tail -n 3 "$dir/sshd.log" | tr '\n' ' ')"; return 1; }
    sleep 0.05
  done
}

# The unit's ssh line for DIR's sshd, its two -L replaced by -L LOCAL:REMOTE per pair.
tunnel_pairs_argv() {
  local dir=$1 pair words argv=() out=() i
  shift
  words=$(tunnel_unit_argv "$tunnel_alias" "$dir" "$dir/known_hosts" /nonexistent \
    "$(cat "$dir/sshd.port")" 0 /nonexistent "$(id -un)@127.0.0.1") || return 1
  mapfile -t argv <<<"$words"
  for ((i = 0; i < ${#argv[@]} - 1; i++)); do
    if [ "${argv[i]}" = -L ]; then i=$((i + 1)); else out+=("${argv[i]}"); fi
  done
  for pair; do
    case $pair in *=*) ;; *) tunnel_die "not LOCAL=REMOTE: $pair"; return 1 ;; esac
    out+=(-L "${pair%%=*}:${pair#*=}")
  done
  printf '%s\n' "${out[@]}" "${argv[-1]}"
}

# Runs ARGV (an ssh -f line) and records and prints the pid of the ssh it leaves running.
tunnel_ssh_start() {
  local dir=$1 pid
  shift
  "$@" </dev/null >>"$dir/ssh.log" 2>&1 || { tunnel_die "ssh exited $?: $(tail -n 3 "$dir/ssh.log" | tr '\n' ' ')"; return 1; }
  pid=$(tunnel_ssh_pid "$dir" "$@") || return 1
  echo "$pid" >>"$dir/ssh.pids"
  echo "$pid"
}

# Every process sshd PID runs, depth first (its sessions and their privilege-separated children).
tunnel_descendants() {
  local child
  for child in $(pgrep -P "$1" || true); do
    tunnel_descendants "$child"
    echo "$child"
  done
}

# Whether any sshd runs on this machine (zombies left to init do not count).
tunnel_sshd_running() {
  local p comm state
  for p in /proc/[0-9]*; do
    { read -r comm <"$p/comm"; } 2>/dev/null || continue
    [ "$comm" = sshd ] || continue
    state=$(cut -d' ' -f3 "$p/stat" 2>/dev/null) || continue
    [ "$state" = Z ] || return 0
  done
  return 1
}

# Stops what DIR's starts left running (stopped processes too) and waits, 5 s at most, for
# every one to be gone; removes DIR.
tunnel_stop() {
  local dir=$1 pids=() p deadline
  [ -d "$dir" ] || return 0
  [ -f "$dir/ssh.pids" ] && mapfile -t -O ${#pids[@]} pids <"$dir/ssh.pids"
  if [ -f "$dir/sshd.pid" ]; then
    mapfile -t -O ${#pids[@]} pids < <(tunnel_descendants "$(cat "$dir/sshd.pid")")
    pids+=("$(cat "$dir/sshd.pid")")
  fi
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill -TERM "$p" 2>/dev/null || true; done
  deadline=$((SECONDS + 5))
  for p in "${pids[@]}"; do
    while kill -0 "$p" 2>/dev/null && [ "$(cut -d' ' -f3 "/proc/$p/stat" 2>/dev/null)" != Z ]; do
      if [ $SECONDS -ge $deadline ]; then kill -KILL "$p" 2>/dev/null || true; break; fi
      sleep 0.05
    done
  done
  # sshd is this shell's child when the functions are sourced: reap it.
  wait "${pids[@]}" 2>/dev/null || true
  # Made by this start; another sshd (another test's, started meanwhile) would still need it.
  if [ -f "$dir/made-run-sshd" ] && ! tunnel_sshd_running; then rmdir /run/sshd 2>/dev/null || true; fi
  rm -rf "$dir"
}

tunnel_main() {
  set -euo pipefail
  local cmd=${1:-} dir=${2:-} pid
  case $cmd in
  start)
    if [ -z "$dir" ] || [ $# -lt 3 ]; then
      echo "usage: $0 start DIR LOCAL=REMOTE [LOCAL=REMOTE ...]" >&2
      exit 2
    fi
    shift 2
    if [ ! -f "$dir/sshd.pid" ]; then
      [ ! -e "$dir" ] || [ -z "$(ls -A "$dir")" ] || { echo "tunnel: $dir is neither empty nor a start's" >&2; exit 2; }
      mkdir -p "$dir"
      tunnel_sshd_start "$dir" || { tunnel_stop "$dir"; exit 1; }
      echo "sshd $(cat "$dir/sshd.pid") $(cat "$dir/sshd.port")"
    fi
    local words argv
    words=$(tunnel_pairs_argv "$dir" "$@") || exit 1
    mapfile -t argv <<<"$words"
    pid=$(tunnel_ssh_start "$dir" "${argv[@]}") || exit 1
    echo "ssh $pid"
    ;;
  stop)
    [ -n "$dir" ] || { echo "usage: $0 stop DIR" >&2; exit 2; }
    tunnel_stop "$dir"
    ;;
  *)
    echo "usage: $0 start DIR LOCAL=REMOTE [LOCAL=REMOTE ...] | stop DIR" >&2
    exit 2
    ;;
  esac
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  tunnel_main "$@"
fi
