#!/usr/bin/env python3
"""Issue 33's figures through `loopd serve` over [[host]] (docs/benchmarks/fleet.md):

  throughput  4 requests at once (max_tokens 64) submitted to a daemon over 2 one-core hosts
              against a daemon over 1 (its 2 slots: a refused submit waits 50 ms and is sent
              again, as the direct baseline's server queues), rounds alternating, medians;
  cache       8 sessions x 4 follow-up submits (each follow-up the conversation so far plus a
              new user turn, its `session` named), affinity against round robin, with
              llama-server's default --cache-ram and with `cache-ram = 0`: the prompt-cache hit
              ratio of the follow-ups (the daemon's loopd_prompt_cache_tokens_total over
              loopd_prompt_tokens_total, before and after them).

Each part starts its own 2-host stack (scripts/fleet-stack.sh start) and its daemons (the
workspace's debug loopd; LOOPD_BIN names another), and stops them on the way out.

  scripts/fleet-figures.py [throughput|cache|all]     (make bench-fleet-loopd)

Environment: ROUNDS (5), FOLLOW_UPS (4), SESSIONS (8), SLOTS (2: the slots of each host's
server, `np` in its preset, all owned by the daemons).
"""
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STACK = os.path.join(ROOT, "scripts", "fleet-stack.sh")
LOOPD = os.environ.get("LOOPD_BIN") or os.path.join(
    os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "debug", "loopd")
ROUNDS = int(os.environ.get("ROUNDS", "5"))
FOLLOW_UPS = int(os.environ.get("FOLLOW_UPS", "4"))
SESSIONS = int(os.environ.get("SESSIONS", "8"))
SLOTS = int(os.environ.get("SLOTS", "2"))

SYSTEM = ("You are a patient tutor. You explain each answer in two short sentences, you never "
          "use lists, and you end every answer with a question for the student. The student "
          "is learning arithmetic, geography and the names of animals; keep to those topics. ")


def say(*a):
    print("fleet-figures:", *a, file=sys.stderr, flush=True)


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


class Stack:
    def __init__(self, preset_extra=""):
        self.run = tempfile.mkdtemp(prefix="ff-", dir="/tmp")
        os.rmdir(self.run)
        env = dict(os.environ, HOSTS="2", FLEET_OWNER_PID=str(os.getpid()))
        if SLOTS != 2:
            preset_extra += f"np = {SLOTS}\n"
        if preset_extra:
            self.extra = tempfile.NamedTemporaryFile("w", suffix=".ini", delete=False)
            self.extra.write(preset_extra)
            self.extra.close()
            env["PRESET_EXTRA"] = self.extra.name
        else:
            self.extra = None
        subprocess.run([STACK, "start", self.run], check=True, env=env)
        with open(os.path.join(self.run, "loopd.toml")) as f:
            self.config = f.read()

    def stop(self):
        subprocess.run([STACK, "stop", self.run], check=False)
        if self.extra:
            os.unlink(self.extra.name)

    def daemon_config(self, name, placement, hosts):
        """A config for a daemon of its own: `placement`, only the [[host]]s in `hosts`."""
        head, *tables = self.config.split("\n[[host]]\n")
        head = head.replace(f"{self.run}/loopd.sock", f"{self.run}/{name}.sock")
        head = head.replace(f"{self.run}/loopd.db", f"{self.run}/{name}.db")
        kept = [t for t in tables if any(f'name = "{h}"' in t for h in hosts)]
        head = head.replace("total_slots = 2", f"total_slots = {SLOTS}")
        # The preset's context (8192) shared by the slots: n_ctx is a slot's.
        head = head.replace("n_ctx = 4096", f"n_ctx = {8192 // SLOTS}")
        owned = ", ".join(str(i) for i in range(SLOTS))
        kept = [t.replace("slots = [0, 1]", f"slots = [{owned}]") for t in kept]
        text = f'placement = "{placement}"\n' + head + "".join(
            "\n[[host]]\n" + t for t in kept)
        path = os.path.join(self.run, f"{name}.toml")
        with open(path, "w") as f:
            f.write(text)
        return path, os.path.join(self.run, f"{name}.sock")


class Daemon:
    def __init__(self, config, sock, log):
        self.sock = sock
        self.log = open(log, "w")
        self.proc = subprocess.Popen([LOOPD, "serve", "--config", config],
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 600
        while True:
            try:
                if call(sock, {"cmd": "status"})["ok"]:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                self.log.flush()
                with open(log) as f:
                    said = f.read()[-2000:]
                raise SystemExit(f"loopd serve did not start; it said:\n{said}")
            time.sleep(0.2)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def call(sock, cmd, timeout=600):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    s.connect(sock)
    s.sendall((json.dumps(cmd) + "\n").encode())
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    s.close()
    return json.loads(buf)


def run_request(sock, cmd):
    """Submits (sending a refused one again every 50 ms), waits for the result."""
    while True:
        r = call(sock, cmd)
        if r["ok"]:
            break
        if r["error"] not in ("NO_SLOT_AVAILABLE",):
            raise SystemExit(f"submit refused: {r}")
        time.sleep(0.05)
    r = call(sock, {"cmd": "wait", "id": r["id"], "timeout_ms": 600000})
    if not r["ok"]:
        raise SystemExit(f"no result: {r}")
    return r["result"]


def metrics(sock):
    text = call(sock, {"cmd": "metrics"})["metrics"]
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def throughput():
    stack = Stack()
    rows = []
    try:
        two_cfg, two_sock = stack.daemon_config("two", "affinity", ["a", "b"])
        one_cfg, one_sock = stack.daemon_config("one", "affinity", ["a"])
        two = Daemon(two_cfg, two_sock, os.path.join(stack.run, "two.log"))
        one = Daemon(one_cfg, one_sock, os.path.join(stack.run, "one.log"))
        try:
            def round_of(sock, n):
                results = [None] * 4

                def go(i):
                    results[i] = run_request(sock, {
                        "cmd": "submit", "budget": 0, "tools": [], "max_tokens": 64,
                        "messages": [{"role": "user", "content":
                                      f"Write a short story about a cat, number {n}-{i}."}]})
                t0 = time.time()
                ts = [threading.Thread(target=go, args=(i,)) for i in range(4)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
                wall = time.time() - t0
                tokens = sum(g["predicted_n"] for r in results for g in r["generations"])
                return tokens / wall, [r.get("host") for r in results]

            round_of(two_sock, -1)
            round_of(one_sock, -1)
            for n in range(ROUNDS):
                order = [("two", two_sock), ("one", one_sock)]
                if n % 2:
                    order.reverse()
                got = {}
                for name, sock in order:
                    got[name] = round_of(sock, n)
                rows.append((got["one"][0], got["two"][0], loadavg(), got["two"][1]))
                say(f"round {n + 1}: 1 host {got['one'][0]:.1f} tok/s, 2 hosts "
                    f"{got['two'][0]:.1f} tok/s (hosts {got['two'][1]}), load {loadavg()}")
        finally:
            two.stop()
            one.stop()
    finally:
        stack.stop()
    one_med = statistics.median(r[0] for r in rows)
    two_med = statistics.median(r[1] for r in rows)
    print(f"throughput through loopd serve, {ROUNDS} rounds, 4 requests x 64 tokens: "
          f"1 host {one_med:.1f} tok/s, 2 hosts {two_med:.1f} tok/s, "
          f"{two_med / one_med:.2f}x (goal >= 1.8x); per round "
          + ", ".join(f"{r[1] / r[0]:.2f}x" for r in rows)
          + f"; load {rows[0][2]} .. {rows[-1][2]}")


def cache_ratio(stack, placement):
    cfg, sock = stack.daemon_config(f"cache-{placement}", placement, ["a", "b"])
    d = Daemon(cfg, sock, os.path.join(stack.run, f"cache-{placement}.log"))
    try:
        convs = [[{"role": "user", "content": f"Student {s}: what is {s + 2} times 3?"}]
                 for s in range(SESSIONS)]

        def turn(s):
            r = run_request(sock, {
                "cmd": "submit", "budget": 0, "tools": [], "max_tokens": 16,
                "session": f"student-{s}", "system": SYSTEM, "messages": convs[s]})
            convs[s].append({"role": "assistant", "content": r.get("content") or ""})
            convs[s].append({"role": "user",
                             "content": f"And what is {len(convs[s])} plus {s}?"})
            return r

        rng = random.Random(33)

        def wave():
            # The sessions in a new order each wave, so that round robin does not give a
            # session the same host every time by the count's parity.
            order = list(range(SESSIONS))
            rng.shuffle(order)
            ts = [threading.Thread(target=turn, args=(s,)) for s in order]
            for t in ts:
                t.start()
                time.sleep(0.02)
            for t in ts:
                t.join()

        wave()  # the first turns: cold, not counted
        before = metrics(sock)
        for _ in range(FOLLOW_UPS):
            wave()
        after = metrics(sock)
        cached = after["loopd_prompt_cache_tokens_total"] - before["loopd_prompt_cache_tokens_total"]
        total = after["loopd_prompt_tokens_total"] - before["loopd_prompt_tokens_total"]
        return cached / total, int(cached), int(total)
    finally:
        d.stop()


def cache():
    for label, extra in (("default --cache-ram", ""), ("cache-ram = 0", "cache-ram = 0\n")):
        stack = Stack(extra)
        try:
            for placement in ("affinity", "round_robin"):
                ratio, cached, total = cache_ratio(stack, placement)
                print(f"cache hit ratio, {SESSIONS} sessions x {FOLLOW_UPS} follow-ups, "
                      f"{label}, {placement}: {ratio:.3f} ({cached} of {total} prompt tokens "
                      f"from the cache); load {loadavg()}", flush=True)
        finally:
            stack.stop()


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    if not shutil.which("socat"):
        raise SystemExit("socat is needed (make socat)")
    subprocess.run(["cargo", "build", "-q", "-p", "loopd", "-p", "inferproxy", "-p",
                    "llama-worker"], check=True, cwd=ROOT)
    if what in ("throughput", "all"):
        throughput()
    if what in ("cache", "all"):
        cache()


if __name__ == "__main__":
    main()
