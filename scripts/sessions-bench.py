#!/usr/bin/env python3
"""Issue 41's figures (docs/benchmarks.md, "Sessions' KV in files"): 8 daemon sessions x 5 turns,
turns interleaved (every session's turn 1, then every session's turn 2, ...), so that each
session comes back to a slot other sessions used since; each session opens with a document of
its own of about a thousand tokens, so a returning turn has that much history to reuse or to
evaluate again. One turn at a time (each turn's time to first token is its own).

Two topologies: host a alone (2 slots: 4 sessions a slot), then hosts a and b (4 slots: 2 a
slot). Three modes, each on a stack of its own (scripts/fleet-stack.sh, as
scripts/fleet-figures.py starts it):

  none          preset `cache-ram = 0`, no [runner.kv]
  cache-ram     llama-server's default host-RAM prompt cache, no [runner.kv]
  save-restore  `cache-ram = 0` and `slot-save-path`; the daemon's [[host]]s name it as
                `kv_dir` ([runner.kv] min_tokens = 0)

Reported for each: the prompt-cache hit ratio of turns 2 to 5 (sum of cache_n over sum of
cache_n + prompt_n, from each turn's `session` record), the prompt tokens evaluated over all
turns (sum of prompt_n), the time to first token of turns 2 to 5 (from sending `turn` to its
first `content` event; median and max), and with save-restore the `kv` events: counts by
outcome, and the saves' and restores' MB/s (their bytes over their `us`, the file's hash and
the server's call together); and the turns whose chat request was tried again (a connection
inferproxy refused past its accept rate, 2 a second after a burst of 10, waits its retry).

  scripts/sessions-bench.py            (make bench-sessions: a release loopd, LOOPD_BIN)

Environment: SESSIONS (8), TURNS (5), DOC_WORDS (700), MODES (none,cache-ram,save-restore),
TOPOLOGIES (1,2).
"""
import importlib.util
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "fleet_figures", os.path.join(ROOT, "scripts", "fleet-figures.py"))
ff = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ff)

SESSIONS = int(os.environ.get("SESSIONS", "8"))
TURNS = int(os.environ.get("TURNS", "5"))
# 800 words are 920-950 tokens with the question: every return has 1,000 tokens or more.
DOC_WORDS = int(os.environ.get("DOC_WORDS", "800"))
MODES = os.environ.get("MODES", "none,cache-ram,save-restore").split(",")
TOPOLOGIES = [int(t) for t in os.environ.get("TOPOLOGIES", "1,2").split(",")]
MAX_TOKENS = 16

WORDS = ("harbour keeper lantern storm gull rope tide island beacon fog signal boat net shell "
         "cliff wind salt wave anchor chart compass deck mast sail oar pier reef rock sand "
         "shore spray star sun moon night morning evening rain cloud thunder lamp oil wick "
         "glass stair tower door window bell clock letter supply ship captain crew cargo").split()
FOLLOW_UPS = ["Which word in the notes comes up most?", "Name one object from the notes.",
              "Say the notes' first word.", "Is a ship in the notes?",
              "Name a colour that fits the notes.", "Give the notes a title."]


def say(*a):
    print("sessions-bench:", *a, file=sys.stderr, flush=True)


def document(k, hosts):
    """Session k's own notes for the topology of `hosts`: DOC_WORDS words in sentences, the
    same on every run, and another text in each topology (the servers run on from one
    topology to the next: a document seen before would be in their caches already)."""
    rng = random.Random(4100 + 100 * hosts + k)
    sentences = []
    words = 0
    while words < DOC_WORDS:
        n = rng.randint(6, 14)
        s = " ".join(rng.choice(WORDS) for _ in range(n))
        sentences.append(s[0].upper() + s[1:] + ".")
        words += n
    return f"Keeper's log number {k}. " + " ".join(sentences)


def turn(sock, session, content):
    """One turn with `follow`, sent again while every slot is busy: its result, its time to
    first token, its kv events."""
    while True:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(900)
        s.connect(sock)
        t0 = time.monotonic()
        s.sendall((json.dumps({"cmd": "turn", "session": session, "content": content,
                               "follow": True}) + "\n").encode())
        f = s.makefile("rb")
        first = json.loads(f.readline())
        if first.get("ok"):
            break
        s.close()
        if first.get("error") not in ("NO_SLOT_AVAILABLE", "WORKER_NOT_READY"):
            raise SystemExit(f"{session}: turn refused: {first}")
        time.sleep(0.05)
    ttft, kv = None, []
    for line in f:
        v = json.loads(line)
        if v.get("event") == "content" and ttft is None:
            ttft = time.monotonic() - t0
        elif v.get("event") == "kv":
            kv.append(v)
        elif "result" in v and "event" not in v:
            s.close()
            r = v["result"]
            if r["outcome"] != "completed":
                raise SystemExit(f"{session}: {r}")
            return r, ttft if ttft is not None else time.monotonic() - t0, kv
        elif v.get("ok") is False:
            raise SystemExit(f"{session}: {v}")
    raise SystemExit(f"{session}: the stream ended without a result")


def with_kv(config_path, kv_dir):
    """The daemon's config with each [[host]]'s kv_dir and [runner.kv] min_tokens = 0."""
    with open(config_path) as f:
        text = f.read()
    head, *tables = text.split("\n[[host]]\n")
    text = head + "\n[runner.kv]\nmin_tokens = 0\n" + "".join(
        f"\n[[host]]\n{t.rstrip()}\nkv_dir = {json.dumps(kv_dir)}\n" for t in tables)
    with open(config_path, "w") as f:
        f.write(text)


def run(stack, mode, hosts, kv_dir):
    name = f"{mode}-{len(hosts)}"
    cfg, sock = stack.daemon_config(name, "affinity", hosts)
    if kv_dir:
        with_kv(cfg, kv_dir)
    d = ff.Daemon(cfg, sock, os.path.join(stack.run, f"{name}.log"))
    rows = []
    try:
        for k in range(SESSIONS):
            r = ff.call(sock, {"cmd": "open", "session": f"s{k}", "tools": [],
                               "max_tokens": MAX_TOKENS,
                               "system": "You answer questions about the keeper's notes "
                                         "the user gives, in one short sentence."})
            if not r.get("ok"):
                raise SystemExit(f"open s{k}: {r}")
        for t in range(TURNS):
            for k in range(SESSIONS):
                content = (f"{document(k, len(hosts))}\n\nSay in one line what these notes "
                           "are about."
                           if t == 0 else FOLLOW_UPS[(t + k) % len(FOLLOW_UPS)])
                r, ttft, kv = turn(sock, f"s{k}", content)
                s = r["session"]
                rows.append({"turn": t + 1, "session": k, "cache_n": s["cache_n"],
                             "prompt_n": s["prompt_n"], "ttft": ttft, "kv": kv,
                             "host": r.get("host"), "retries": len(r.get("retries") or [])})
            say(f"{name}: turn {t + 1} of every session done; load {ff.loadavg()}")
    finally:
        d.stop()
    back = [r for r in rows if r["turn"] > 1]
    cached = sum(r["cache_n"] for r in back)
    total = sum(r["cache_n"] + r["prompt_n"] for r in back)
    ttfts = [r["ttft"] for r in back]
    out = {
        "mode": mode, "hosts": len(hosts),
        "ratio": cached / total if total else 0.0,
        "evaluated": sum(r["prompt_n"] for r in rows),
        "history": statistics.median(r["cache_n"] + r["prompt_n"] for r in back),
        "history_min": min(r["cache_n"] + r["prompt_n"] for r in back),
        "ttft_med": statistics.median(ttfts), "ttft_max": max(ttfts),
        "kv": {}, "save": [0, 0, []], "restore": [0, 0, []],
        "retried": sum(1 for r in rows if r["retries"]),
    }
    for r in rows:
        for e in r["kv"]:
            key = f"{e['action']} {e['outcome']}"
            out["kv"][key] = out["kv"].get(key, 0) + 1
            if e["outcome"] in ("saved", "restored"):
                acc = out[e["action"]]
                acc[0] += e["bytes"]
                acc[1] += e["us"]
                if e["bytes"]:
                    acc[2].append(e["us"] / 1000 / (e["bytes"] / 1e6))
    return out


def mb_s(acc):
    """All bytes over all time, and the median event's ms a MB (one slow event does not move
    it)."""
    if not acc[1]:
        return "-"
    return (f"{acc[0] / acc[1]:.0f} MB/s ({acc[0] / 1e6:.0f} MB); median "
            f"{statistics.median(acc[2]):.2f} ms a MB")


def main():
    if not shutil.which("socat"):
        raise SystemExit("socat is needed (make socat)")
    if not os.environ.get("LOOPD_BIN"):
        subprocess.run(["cargo", "build", "-q", "-p", "loopd", "-p", "inferproxy", "-p",
                        "llama-worker"], check=True, cwd=ROOT)
    say(f"loopd: {ff.LOOPD}")
    results = []
    for mode in MODES:
        kv_dir = None
        extra = "" if mode == "cache-ram" else "cache-ram = 0\n"
        if mode == "save-restore":
            kv_dir = os.path.join("/tmp", f"sessions-bench-kv-{os.getpid()}")
            os.makedirs(kv_dir, exist_ok=True)
            extra += f"slot-save-path = {kv_dir}\n"
        stack = ff.Stack(extra)
        try:
            for n in TOPOLOGIES:
                if kv_dir:
                    for f in os.listdir(kv_dir):
                        os.unlink(os.path.join(kv_dir, f))
                got = run(stack, mode, ["a", "b"][:n], kv_dir)
                results.append(got)
                say(f"{mode}, {n} host(s): hit ratio {got['ratio']:.3f}, evaluated "
                    f"{got['evaluated']}, ttft median {got['ttft_med']:.2f} s, kv {got['kv']}")
        finally:
            stack.stop()
            if kv_dir:
                shutil.rmtree(kv_dir, ignore_errors=True)
    print(f"{SESSIONS} sessions x {TURNS} turns, one at a time, a {DOC_WORDS}-word document "
          f"each, max_tokens {MAX_TOKENS}; turns 2-{TURNS} are the returning ones\n")
    print("| hosts (slots) | mode | hit ratio, turns 2-5 | tokens evaluated | history at a "
          "return, min / median | first token of a return, median / max | turns retried "
          "| kv events | save | restore |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in sorted(results, key=lambda r: (r["hosts"], MODES.index(r["mode"]))):
        kv = ", ".join(f"{k} {v}" for k, v in sorted(r["kv"].items())) or "-"
        print(f"| {r['hosts']} ({2 * r['hosts']}) | {r['mode']} | {r['ratio']:.3f} | "
              f"{r['evaluated']:,} | {r['history_min']:,} / {r['history']:,.0f} tokens | "
              f"{r['ttft_med']:.2f} s / {r['ttft_max']:.2f} s | {r['retried']} | {kv} | "
              f"{mb_s(r['save'])} | {mb_s(r['restore'])} |")
    for n in TOPOLOGIES:
        by = {r["mode"]: r for r in results if r["hosts"] == n}
        if "save-restore" in by:
            sr = by["save-restore"]
            goal = "met" if sr["ratio"] >= 0.9 else "NOT met"
            line = (f"{n} host(s), {SESSIONS // (2 * n)} sessions a slot: save-restore hit "
                    f"ratio {sr['ratio']:.3f} (goal >= 0.9: {goal})")
            if "none" in by:
                faster = by["none"]["ttft_med"] / sr["ttft_med"]
                line += (f"; a returning session's first token {sr['ttft_med']:.2f} s against "
                         f"{by['none']['ttft_med']:.2f} s evaluated again ({faster:.1f}x)")
            print(line)


if __name__ == "__main__":
    main()
