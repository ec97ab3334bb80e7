#!/usr/bin/env python3
"""Shows each fact of docs/inference-contract.md against a running local router.

    scripts/serve.sh --port 18080 &      # or make serve
    scripts/probe-contract.py 18080

Prints, for each probe, the request and what the server answered (bodies cut to 600 bytes).
Standard library only. It unloads and reloads the model, so run it on a router nobody else uses.
"""
import http.client
import json
import sys
import threading
import time

PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 18080
MODEL = "smollm2"


def req(method, path, body=None, timeout=600):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)
    data = json.dumps(body).encode() if body is not None else None
    c.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
    r = c.getresponse()
    out = r.read()
    c.close()
    return r.status, out


def show(title, method, path, body=None):
    status, out = req(method, path, body)
    print(f"### {title}\n{method} {path}" + (f"  {json.dumps(body)[:300]}" if body else ""))
    print(f"-> {status} {out[:600].decode(errors='replace')}\n")
    return status, out


def chat(content, **extra):
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0,
            "max_tokens": 8, "chat_template_kwargs": {"enable_thinking": False}}
    body.update(extra)
    return body


def main():
    show("props (router needs ?model=)", "GET", "/props")
    status, out = req("GET", f"/props?model={MODEL}")
    props = json.loads(out)
    print("### props?model= fields the client reads")
    print(json.dumps({"total_slots": props["total_slots"],
                      "default_generation_settings.n_ctx": props["default_generation_settings"]["n_ctx"],
                      "chat_template (bytes)": len(props["chat_template"].encode())}), "\n")
    show("slots", "GET", f"/slots?model={MODEL}")
    show("unload the model", "POST", "/models/unload", {"model": MODEL})
    seen = []
    for _ in range(100):
        status, out = req("GET", "/models")
        value = json.loads(out)["data"][0]["status"]["value"]
        if not seen or seen[-1] != value:
            seen.append(value)
        if value == "unloaded":
            break
        time.sleep(0.1)
    print(f"### model status after unload, polled every 100 ms\n{' -> '.join(seen)}\n")
    show("slots while unloaded, autoload=false", "GET", f"/slots?model={MODEL}&autoload=false")
    show("props while unloaded, autoload=false", "GET", f"/props?model={MODEL}&autoload=false")
    # A chat request loads the model; /slots (autoload=false) is polled while that load runs.
    t = threading.Thread(target=lambda: show("chat request that loads the model", "POST",
                                             "/v1/chat/completions", chat("Hi")))
    t.start()
    answers = []
    while t.is_alive() and len(answers) < 4:
        status, out = req("GET", f"/slots?model={MODEL}&autoload=false")
        answer = f"{status} {out[:160].decode(errors='replace')}"
        if not answers or answers[-1] != answer:
            answers.append(answer)
        time.sleep(0.05)
    print("### slots (autoload=false) while the chat request loads the model, distinct answers")
    print("\n".join(answers), "\n")
    t.join()
    show("control, unknown id", "POST", "/v1/chat/completions/control",
         {"id": "chatcmpl-nope", "action": "reasoning_end", "model": MODEL})
    status, out = req("POST", "/v1/chat/completions", chat("Hi"))
    done_id = json.loads(out)["id"]
    show("control, finished id", "POST", "/v1/chat/completions/control",
         {"id": done_id, "action": "reasoning_end", "model": MODEL})
    show("prompt that does not fit the context", "POST", "/v1/chat/completions",
         chat("word " * 5000))
    # Hold slot 0 with a long generation, then pin a second request to it.
    hold = chat("Write a long story about a lighthouse.", max_tokens=48, id_slot=0)
    t = threading.Thread(target=lambda: req("POST", "/v1/chat/completions", hold))
    t.start()
    time.sleep(1.0)
    show("slots while slot 0 is busy", "GET", f"/slots?model={MODEL}")
    started = time.time()
    show("request pinned to the busy slot 0", "POST", "/v1/chat/completions", chat("Hi", id_slot=0))
    print(f"(the pinned request returned after {time.time() - started:.1f} s)\n")
    t.join()


if __name__ == "__main__":
    main()
