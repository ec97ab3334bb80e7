#!/usr/bin/env bash
# Aggregate generated tokens/s of 4 concurrent requests on 2 one-core hosts against 1 one-core
# host (issue 33's first figure), sent straight to the hosts' forwarded inferproxy sockets: the
# baseline that `loopd serve` over [[host]] is compared against later (docs/benchmarks/fleet.md).
#
#   scripts/fleet-bench.sh            (make bench-fleet; ROUNDS=7 MAX_TOKENS=64 WARMUP=1)
#
# One stack of 2 hosts (scripts/fleet-stack.sh start: a on core 0, b on core 1, each 2 slots and
# one thread). A round sends 4 chat completions at once (temperature 0, seed 42, max_tokens
# MAX_TOKENS, a different user message each, `id_slot` one per slot): "1 host" puts all 4 on
# host a (slots 0, 1, 0, 1: two wait for a slot), "2 hosts" puts 2 on a and 2 on b (slots 0 and
# 1 on each). The two setups take turns in every round (the order alternating), so a neighbour's
# load slows both alike. A setup's figure is the sum of the responses' `timings.predicted_n`
# over the round's wall time (first send to last response), its median over ROUNDS (the WARMUP
# rounds are not counted). /proc/loadavg is printed with each round. While the rounds run, the
# model instances' threads are sampled every 50 ms (/proc/PID/task/*/stat, the CPU each last ran
# on) with their allowed CPUs and CPU time, to show each host stayed on its own core; the CPU
# time the instances used over a round's wall time says how many cores they actually got from
# a shared box (1 host can use at most 1, 2 hosts 2).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
run=$(mktemp -d "${TMPDIR:-/tmp}/boxmaker-fleet-bench-XXXXXX")
started=
cleanup() {
  local status=$?
  # A start that failed has stopped its hosts and kept their logs in $run: leave them.
  if [ -n "$started" ]; then
    scripts/fleet-stack.sh stop "$run" || status=1
  fi
  # A failed start keeps its logs in $run and says so; an empty $run is ours to remove.
  rmdir "$run" 2>/dev/null || true
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "fleet-bench: load average before the stack: $(cat /proc/loadavg)"
HOSTS=2 scripts/fleet-stack.sh start "$run" >/dev/null
started=1
python3 - "$run" <<'PY'
import http.client, json, os, socket, statistics, sys, threading, time

run = sys.argv[1]
rounds = int(os.environ.get("ROUNDS", "7"))
warmup = int(os.environ.get("WARMUP", "1"))
max_tokens = int(os.environ.get("MAX_TOKENS", "64"))

env = {}
for line in open(os.path.join(run, "hosts.env")):
    if "=" in line and not line.startswith("#"):
        k, v = line.rstrip("\n").split("=", 1)
        env[k] = v
sockets = {h: env[f"{h.upper()}_INFER_SOCKET"] for h in ("a", "b")}
instances = {h: int(env[f"{h.upper()}_INSTANCE_PID"]) for h in ("a", "b")}
cores = {h: env[f"{h.upper()}_CORE"] for h in ("a", "b")}

PROMPTS = [
    "Write a long story about a fox who learns to sail.",
    "Explain in detail how a bicycle works, part by part.",
    "Describe a busy market in a port town at dawn.",
    "Write a letter from a lighthouse keeper to her brother.",
]
SETUPS = {
    "1 host": [("a", 0), ("a", 1), ("a", 0), ("a", 1)],
    "2 hosts": [("a", 0), ("a", 1), ("b", 0), ("b", 1)],
}


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("fleet", timeout=300)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(300)
        self.sock.connect(self.path)


def complete(host, slot, prompt):
    body = json.dumps({
        "model": "smollm2",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 42,
        "id_slot": slot,
    })
    c = UnixConnection(sockets[host])
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"host {host} slot {slot}: HTTP {r.status}: {data[:300]!r}")
    return json.loads(data)


def one_round(setup):
    plan = SETUPS[setup]
    results = [None] * len(plan)
    errors = []
    start = threading.Barrier(len(plan) + 1)

    def worker(i, host, slot):
        start.wait()
        try:
            results[i] = complete(host, slot, PROMPTS[i])
        except Exception as e:  # reported after the round
            errors.append(str(e))

    threads = [threading.Thread(target=worker, args=(i, h, s)) for i, (h, s) in enumerate(plan)]
    for t in threads:
        t.start()
    load_before = open("/proc/loadavg").read().split()[:3]
    start.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    if errors:
        sys.exit("fleet-bench: " + "; ".join(errors))
    tokens = sum(r["timings"]["predicted_n"] for r in results)
    per_request = [r["timings"]["predicted_per_second"] for r in results]
    return {
        "tokens": tokens,
        "wall": wall,
        "tps": tokens / wall,
        "per_request": per_request,
        "load": load_before,
    }


def task_cpus(pid):
    """{tid: (last cpu, utime+stime ticks)} of each thread of pid."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = open(f"/proc/{pid}/task/{tid}/stat").read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        # After the comm: state is field 3, utime 14, stime 15, processor 39 (1-based, man 5 proc).
        out[tid] = (int(fields[39 - 3]), int(fields[14 - 3]) + int(fields[15 - 3]))
    return out


def allowed(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return "?"


seen = {h: set() for h in instances}
busy_seen = {h: set() for h in instances}
sampling = threading.Event()
stop = threading.Event()


def sampler():
    last = {h: task_cpus(p) for h, p in instances.items()}
    while not stop.wait(0.05):
        for h, p in instances.items():
            now = task_cpus(p)
            for tid, (cpu, ticks) in now.items():
                seen[h].add(cpu)
                if sampling.is_set() and ticks > last[h].get(tid, (cpu, ticks))[1]:
                    busy_seen[h].add(cpu)
            last[h] = now


def cpu_ticks(pid):
    return sum(t for _, t in task_cpus(pid).values())


threading.Thread(target=sampler, daemon=True).start()
print(f"fleet-bench: hosts a (core {cores['a']}, instance {instances['a']}, allowed "
      f"{allowed(instances['a'])}) and b (core {cores['b']}, instance {instances['b']}, allowed "
      f"{allowed(instances['b'])}); {rounds} rounds after {warmup} warm-up, 4 requests, "
      f"max_tokens {max_tokens}")
figures = {s: [] for s in SETUPS}
ticks_two = {h: 0 for h in instances}
for r in range(warmup + rounds):
    order = list(SETUPS) if r % 2 == 0 else list(reversed(SETUPS))
    line = []
    for setup in order:
        before = {h: cpu_ticks(p) for h, p in instances.items()}
        sampling.set()
        f = one_round(setup)
        sampling.clear()
        used = {h: (cpu_ticks(p) - before[h]) / 100 for h, p in instances.items()}
        f["cores"] = sum(used.values()) / f["wall"]
        f["per_cpu_s"] = f["tokens"] / max(sum(used.values()), 0.01)
        if setup == "2 hosts" and r >= warmup:
            for h in instances:
                ticks_two[h] += used[h]
        if r >= warmup:
            figures[setup].append(f)
        line.append(f"{setup}: {f['tokens']} tokens in {f['wall']:.2f} s = {f['tps']:.1f} tok/s, "
                    f"{f['cores']:.2f} cores (load {' '.join(f['load'])})")
    tag = "warm-up" if r < warmup else f"round {r - warmup + 1}"
    print(f"  {tag}: " + "; ".join(line))
stop.set()

one = statistics.median(f["tps"] for f in figures["1 host"])
two = statistics.median(f["tps"] for f in figures["2 hosts"])
ratios = [b["tps"] / a["tps"] for a, b in zip(figures["1 host"], figures["2 hosts"])]
print()
print("| setup | median aggregate tok/s | min-max | median per-request tok/s (timings) "
      "| cores the instances got (CPU s / wall) | tokens per instance CPU-second |")
print("| --- | --- | --- | --- | --- | --- |")
for s in SETUPS:
    tps = [f["tps"] for f in figures[s]]
    per = statistics.median(x for f in figures[s] for x in f["per_request"])
    cores_got = statistics.median(f["cores"] for f in figures[s])
    per_cpu = statistics.median(f["per_cpu_s"] for f in figures[s])
    print(f"| {s} | {statistics.median(tps):.1f} | {min(tps):.1f}-{max(tps):.1f} | {per:.1f} "
          f"| {cores_got:.2f} | {per_cpu:.1f} |")
print()
print(f"2 hosts / 1 host: {two / one:.2f}x (medians); per round {min(ratios):.2f}-{max(ratios):.2f}x, "
      f"median {statistics.median(ratios):.2f}x (goal of issue 33: >= 1.8x)")
print(f"CPUs the instances' threads ran on while a round ran (sampled every 50 ms, only threads that "
      f"used CPU): a {sorted(busy_seen['a'])}, b {sorted(busy_seen['b'])}; any thread ever: "
      f"a {sorted(seen['a'])}, b {sorted(seen['b'])}; allowed now: a {allowed(instances['a'])}, "
      f"b {allowed(instances['b'])}")
print(f"CPU time of the instances in the counted 2-host rounds: a {ticks_two['a']:.1f} s, "
      f"b {ticks_two['b']:.1f} s")
if busy_seen["a"] & busy_seen["b"] or seen["a"] & seen["b"]:
    sys.exit("fleet-bench: the two hosts' instances shared a core")
PY
echo "fleet-bench: load average after: $(cat /proc/loadavg)"
started=
scripts/fleet-stack.sh stop "$run"
