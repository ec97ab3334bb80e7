#!/usr/bin/env bash
# The systemd files in docs/ checked as an operator would install them (make units-check, part
# of make test):
#   - `systemd-analyze verify` of the five units (the template loopd-tunnel@.service as its
#     instance loopd-tunnel@i) prints nothing and exits 0, in a temporary root
#     that holds this host's system units, the units and a stand-in for each ExecStart= binary;
#   - `systemd-analyze security --offline=true` rates each unit below 4.0, and the figure is the
#     one docs/production.md states;
#   - docs/boxmaker.sysusers.conf creates the users and the group the units name (each unit's
#     User= and Group= exist afterwards, every user's primary group but ggml-rpc's is boxmaker), and
#     docs/boxmaker.tmpfiles.conf the metrics folder both daemons' ReadWritePaths= name.
# Without systemd-analyze it says so and exits 0 (nothing can be checked); any failure exits 1.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
docs=$root/docs
units=(inferproxy.service llama-worker.service loopd.service ggml-rpc-server.service loopd-tunnel@.service)
limit=4.0

if ! command -v systemd-analyze >/dev/null; then
  echo "units-check: SKIPPED: systemd-analyze is not installed (apt-get install systemd)"
  exit 0
fi

fail=0
bad() { echo "units-check: FAIL: $*" >&2; fail=1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/boxmaker-units-XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# The value of KEY= in a unit (the last one wins, as in systemd).
unit_key() { sed -n "s/^$2=//p" "$docs/$1" | tail -n 1; }

# 1. verify, in a root of its own: --root makes it look for the binaries and the units there.
mkdir -p "$tmp/root/etc/systemd/system" "$tmp/root/usr/lib/systemd"
cp -a /usr/lib/systemd/system "$tmp/root/usr/lib/systemd/"
for u in "${units[@]}"; do
  cp "$docs/$u" "$tmp/root/etc/systemd/system/"
  exe=$(unit_key "$u" ExecStart | cut -d' ' -f1)
  mkdir -p "$tmp/root$(dirname "$exe")"
  printf '#!/bin/sh\n' >"$tmp/root$exe"
  chmod 755 "$tmp/root$exe"
done
out=$(systemd-analyze verify --man=no --generators=no --root="$tmp/root" \
  "${units[@]/#/$tmp/root/etc/systemd/system/}" 2>&1) || bad "systemd-analyze verify exited $?"
if [ -n "$out" ]; then
  bad "systemd-analyze verify is not clean:"
  echo "$out" | sed 's/^/  | /' >&2
else
  echo "units-check: systemd-analyze verify: clean (${units[*]})"
fi

# 2. security, each unit below the limit and as documented.
for u in "${units[@]}"; do
  line=$(systemd-analyze security --offline=true "$docs/$u" 2>&1 | grep 'Overall exposure level' || true)
  figure=$(echo "$line" | sed -n 's/.*: \([0-9]*\.[0-9]\) .*/\1/p')
  if [ -z "$figure" ]; then
    bad "$u: no exposure level from systemd-analyze security"
    continue
  fi
  echo "units-check: systemd-analyze security --offline=true $u: $figure"
  if ! awk -v f="$figure" -v l="$limit" 'BEGIN { exit !(f < l) }'; then
    bad "$u: exposure $figure is not below $limit"
  fi
  if ! grep -q "^| \`$u\` | $figure |" "$docs/production.md"; then
    bad "$u: docs/production.md does not state its exposure as \"| \`$u\` | $figure |\""
  fi
done

# 3. the users, the group and the metrics folder, created in the same root.
mkdir -p "$tmp/root/etc/sysusers.d" "$tmp/root/etc/tmpfiles.d"
cp "$docs/boxmaker.sysusers.conf" "$tmp/root/etc/sysusers.d/boxmaker.conf"
cp "$docs/boxmaker.tmpfiles.conf" "$tmp/root/etc/tmpfiles.d/boxmaker.conf"
systemd-sysusers --root="$tmp/root" boxmaker.conf >/dev/null 2>&1 || bad "systemd-sysusers exited $?"
gid_of() { awk -F: -v n="$1" '$1 == n { print $3 }' "$tmp/root/etc/group"; }
for u in "${units[@]}"; do
  user=$(unit_key "$u" User)
  group=$(unit_key "$u" Group)
  entry=$(awk -F: -v n="$user" '$1 == n' "$tmp/root/etc/passwd")
  if [ -z "$entry" ]; then
    bad "$u: User=$user is not created by docs/boxmaker.sysusers.conf"
  elif [ -z "$(gid_of "$group")" ]; then
    bad "$u: Group=$group is not created by docs/boxmaker.sysusers.conf"
  elif [ "$u" != ggml-rpc-server.service ] && [ "$(echo "$entry" | cut -d: -f4)" != "$(gid_of boxmaker)" ]; then
    bad "$u: $user's primary group is not boxmaker"
  fi
done
systemd-tmpfiles --root="$tmp/root" --create boxmaker.conf >/dev/null 2>&1 || bad "systemd-tmpfiles exited $?"
for u in llama-worker.service loopd.service; do
  dir=$(unit_key "$u" ReadWritePaths)
  dir=${dir#-}
  if [ ! -d "$tmp/root$dir" ]; then
    bad "$u: ReadWritePaths=$dir is not created by docs/boxmaker.tmpfiles.conf"
  elif [ "$(stat -c '%a %g' "$tmp/root$dir")" != "2775 $(gid_of boxmaker)" ]; then
    bad "$u: $dir is $(stat -c '%a gid %g' "$tmp/root$dir"), not 2775 group boxmaker"
  fi
done
[ $fail -eq 0 ] && echo "units-check: sysusers and tmpfiles: the units' users, group boxmaker and the metrics folder"

exit $fail
