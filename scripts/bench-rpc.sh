#!/usr/bin/env bash
# make bench-rpc: the test model through llama.cpp's RPC backend against the same model run
# locally, in one run: llama-bench local, through one loopback ggml-rpc-server holding every
# layer (-ngl 99), and split over two. Same build, same threads (-t), same sizes. The setups
# take turns, one repetition each per round (R rounds), so a busy neighbour slows all three
# alike. Prints one markdown table (prompt and generation tokens per second, mean ± stddev over
# the rounds) and the ratios to local; docs/benchmarks/rpc.md says what bounds each figure.
#
#   P=128 N=128 T=2 R=3 scripts/bench-rpc.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
P=${P:-128}
N=${N:-128}
T=${T:-2}
R=${R:-3}
server=$("$root/scripts/llama-server.sh" build)
bin=$(dirname "$server")
model=$("$root/scripts/llama-server.sh" model)/SmolLM2-135M-Instruct.Q4_1.gguf
rpc=$bin/ggml-rpc-server
bench=$bin/llama-bench
work=$(mktemp -d "${TMPDIR:-/tmp}/bench-rpc-XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start_rpc() { # sets $endpoint (not a subshell: the pid must land in $pids)
  local port
  port=$(free_port)
  "$rpc" -H 127.0.0.1 -p "$port" -t "$T" >"$work/rpc-$port.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 100); do
    (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null && { endpoint=127.0.0.1:$port; return; }
    sleep 0.1
  done
  echo "bench-rpc: ggml-rpc-server on $port did not listen in 10 s" >&2
  exit 1
}
run() { # label, round, extra llama-bench args...
  local label=$1 round=$2
  shift 2
  "$bench" -m "$model" -p "$P" -n "$N" -t "$T" -r 1 -o json "$@" >"$work/$label-$round.json" 2>"$work/$label.err" ||
    { cat "$work/$label.err" >&2; exit 1; }
}
echo "bench-rpc: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), -p $P -n $N -t $T -r $R" >&2
start_rpc
one=$endpoint
start_rpc
a=$endpoint
start_rpc
b=$endpoint
for ((i = 1; i <= R; i++)); do
  run local "$i"
  run rpc1 "$i" --rpc "$one" -ngl 99
  run rpc2 "$i" --rpc "$a,$b" -ngl 99
done
echo "bench-rpc: load average after $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 - "$work" "$P" "$N" "$R" <<'PY'
import json, statistics, sys
work, P, N, R = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
samples = {}
for label in ["local", "rpc1", "rpc2"]:
    for i in range(1, R + 1):
        for r in json.load(open(f"{work}/{label}-{i}.json")):
            kind = "pp" if r["n_prompt"] > 0 and r["n_gen"] == 0 else "tg"
            samples.setdefault((label, kind), []).append(r["avg_ts"])
rows = {k: (statistics.mean(v), statistics.stdev(v) if len(v) > 1 else 0.0) for k, v in samples.items()}
names = {"local": "local (CPU)", "rpc1": "1 loopback ggml-rpc-server, -ngl 99",
         "rpc2": "2 loopback ggml-rpc-servers, split, -ngl 99"}
print(f"| setup | prompt pp{P} tok/s | generation tg{N} tok/s | pp / local | tg / local |")
print("| --- | --- | --- | --- | --- |")
for label in ["local", "rpc1", "rpc2"]:
    pp, tg = rows[(label, "pp")], rows[(label, "tg")]
    rp = pp[0] / rows[("local", "pp")][0]
    rt = tg[0] / rows[("local", "tg")][0]
    print(f"| {names[label]} | {pp[0]:.1f} ± {pp[1]:.1f} | {tg[0]:.1f} ± {tg[1]:.1f} | {rp:.2f} | {rt:.2f} |")
PY
