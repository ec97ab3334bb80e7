#!/usr/bin/env python3
"""Records fixtures/ from the local llama-server (make fixtures).

Starts scripts/serve.sh on a free port, sends each request below, and writes for each NAME:
  fixtures/NAME.request.json   the request body sent
  fixtures/NAME.sse            the response body as the server sent it (HTTP framing removed)
  fixtures/NAME.response.json  for pairs: the non-streamed response to the same request
and the raw HTTP responses (head and chunked body, as received) of RAW below, and the router's
own answers in fixtures/router/ (its model list with the model loaded, and with a model whose
instance cannot load, a GGUF cut to a quarter: the list and the 500 a request then gets), and
`GET /slots` while slot 1 streams a story (fixtures/slots.generating.json: llama-worker reads each
slot's `next_token[0].n_decoded` from it).
Nothing here is edited by hand afterwards; fixtures/README.md describes each one.
Standard library only.

  scripts/record-fixtures.py                 records everything
  scripts/record-fixtures.py --only NAME...  records only these (a NAME of PAIRS, STREAMS or RAW,
                                             or reasoning_end, router or slots), leaving the others as they are
"""
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "fixtures")
MODEL = "smollm2"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name"}},
            "required": ["city"],
        },
    },
}


# Two worked examples, then the question: a small model copies the pattern, a large one needs no
# help; both answer with a call. tool_choice stays "auto", as loopd sends it.
TOOL_PROMPT = [
    {"role": "system", "content": "You answer every question by calling a tool."},
    {"role": "user", "content": "What is the weather in Rome?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
    {"role": "user", "content": "What is the weather in Oslo?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_2", "type": "function", "function": {
        "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
    {"role": "user", "content": "What is the weather in Paris?"},
]


def text_call(city):
    return ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>'
            % city)


TEXT_TOOL_PROMPT = [
    {"role": "system", "content": "You answer every question by calling a tool.\n\n# Tools\n\n"
     "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
     + json.dumps(WEATHER_TOOL) + "\n</tools>\n\nFor each function call, return a json object "
     "with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
     "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"},
    {"role": "user", "content": "What is the weather in Rome?"},
    {"role": "assistant", "content": text_call("Rome")},
    {"role": "user", "content": "What is the weather in Oslo?"},
    {"role": "assistant", "content": text_call("Oslo")},
    {"role": "user", "content": "What is the weather in Paris?"},
]


def base(messages, thinking, max_tokens, stream=True, **extra):
    body = {
        "model": MODEL,
        "messages": messages,
        "stream": stream,
        "temperature": 0,
        "max_tokens": max_tokens,
        "cache_prompt": False,
        "chat_template_kwargs": {"enable_thinking": thinking},
    }
    if stream:
        body.update({"return_progress": True, "timings_per_token": True})
    body.update(extra)
    return body


def long_prompt():
    # About 2,500 tokens: longer than one 512-token micro-batch several times over, so the server
    # reports prompt progress more than once.
    para = ("The lighthouse keeper wrote in the log every evening: the wind, the tide, the ships "
            "that passed, and the colour of the sky over the harbour before the lamp was lit. ")
    return para * 70 + "\nIn one sentence, what did the keeper write about?"


PAIRS = {
    "plain": base([{"role": "user", "content": "Name three colours."}], False, 48),
    # The budget makes the server close the think block after 24 tokens, so the transcript holds
    # reasoning and then an answer.
    "thinking": base([{"role": "user", "content": "What is 2 + 3? Think first."}], True, 96,
                     reasoning_budget_tokens=24),
    "tool_call": base(TOOL_PROMPT, False, 64, tools=[WEATHER_TOOL]),
    # The same conversation with the tools described in the system message and the worked
    # calls written as text, and no `tools` field: the server parses no call, so the content
    # holds the model's own `<tool_call>` text, the input of llama-proto's fallback parser.
    "tool_call_text": base(TEXT_TOOL_PROMPT, False, 64),
}
STREAMS = {
    "progress": base([{"role": "user", "content": long_prompt()}], False, 16),
    # Greedy decoding on this prompt falls into writing one sentence over and over inside a
    # paragraph: the loop detector's real input.
    "looping": base([{"role": "user", "content": "Write a poem about the sea."}], False, 400),
}
# Raw HTTP responses, written to fixtures/<file>: the plain stream, and a streamed tool call (what
# the firmware image under embedded/ feeds through the whole no_std path).
RAW = {
    "chunked_response": ("chunked_response.http", PAIRS["plain"]),
    "chunked_tool_call": ("chunked_tool_call.http", PAIRS["tool_call"]),
}


class Server:
    def __init__(self, model_file=None):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        env = dict(os.environ, MODEL_FILE=model_file) if model_file else None
        self.proc = subprocess.Popen(
            [os.path.join(ROOT, "scripts/serve.sh"), "--port", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=open("/tmp/record-fixtures-server.log", "w"),
            start_new_session=True, env=env)
        if model_file:
            return  # a model that cannot load: the caller waits for what it records
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                status, _ = self.request("GET", f"/props?model={MODEL}")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        sys.exit("server did not come up; see /tmp/record-fixtures-server.log")

    def conn(self):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)

    def request(self, method, path, body=None):
        c = self.conn()
        data = json.dumps(body).encode() if body is not None else None
        c.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        r = c.getresponse()
        out = r.read()
        c.close()
        return r.status, out

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)


def write(name, data):
    with open(os.path.join(FIX, name), "wb") as f:
        f.write(data)
    print(f"  wrote fixtures/{name} ({len(data)} bytes)")


def record_body(srv, name, body):
    write(f"{name}.request.json", (json.dumps(body, indent=2) + "\n").encode())
    status, out = srv.request("POST", "/v1/chat/completions", body)
    assert status == 200, (name, status, out[:300])
    write(f"{name}.sse" if body["stream"] else f"{name}.response.json", out)


def record_reasoning_end(srv):
    """Streams a thinking answer and, after the third reasoning chunk, posts reasoning_end."""
    body = base([{"role": "user", "content": "Explain why the sky is blue."}], True, 160,
                reasoning_control=True)
    write("reasoning_end.request.json", (json.dumps(body, indent=2) + "\n").encode())
    c = srv.conn()
    c.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.status
    raw, reasoning_chunks, control = b"", 0, None
    while True:
        line = r.readline()
        if not line:
            break
        raw += line
        if line.startswith(b"data: {") and control is None:
            chunk = json.loads(line[6:])
            delta = (chunk.get("choices") or [{}])[0].get("delta", {})
            if delta.get("reasoning_content"):
                reasoning_chunks += 1
                if reasoning_chunks == 3:
                    req = {"id": chunk["id"], "action": "reasoning_end", "model": MODEL}
                    control = (req, srv.request("POST", "/v1/chat/completions/control", req))
    c.close()
    write("reasoning_end.sse", raw)
    req, (status, answer) = control
    write("reasoning_end.control.json",
          (json.dumps({"request": req, "status": status, "response": json.loads(answer)}, indent=2)
           + "\n").encode())


def record_raw_chunked(srv, file, request):
    body = json.dumps(request).encode()
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
              b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    raw = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        raw += d
    s.close()
    write(file, raw)


def record_router(srv):
    """The router's model list with the model loaded, then with one whose instance cannot load."""
    os.makedirs(os.path.join(FIX, "router"), exist_ok=True)
    status, out = srv.request("GET", "/models")
    assert status == 200 and b'"value":"loaded"' in out, (status, out[:300])
    write("router/models-loaded.json", out)
    model = subprocess.run([os.path.join(ROOT, "scripts/llama-server.sh"), "model"], check=True,
                           capture_output=True, text=True).stdout.strip()
    data = open(os.path.join(model, "SmolLM2-135M-Instruct.Q4_1.gguf"), "rb").read()
    cut = "/tmp/record-fixtures-cut.gguf"
    with open(cut, "wb") as f:
        f.write(data[:len(data) // 4])
    broken = Server(model_file=cut)
    try:
        deadline = time.time() + 60
        while True:
            try:
                status, out = broken.request("GET", "/models")
                if status == 200 and b'"failed":true' in out:
                    break
            except OSError:
                pass
            assert time.time() < deadline, "the cut model never showed as failed"
            time.sleep(0.2)
        write("router/models-failed.json", out)
        status, out = broken.request("GET", f"/props?model={MODEL}")
        assert status == 500, (status, out[:300])
        write("router/props-failed-to-load.json", out)
    finally:
        broken.stop()
        os.remove(cut)


def record_slots(srv):
    """`GET /slots` while slot 1 streams: the first answer with a token decoded on it."""
    body = base([{"role": "user", "content": "Write a long story about a lighthouse."}], False,
                200, id_slot=1)
    done = threading.Event()

    def generate():
        try:
            srv.request("POST", "/v1/chat/completions", body)
        finally:
            done.set()

    threading.Thread(target=generate, daemon=True).start()
    deadline = time.time() + 120
    while True:
        assert not done.is_set() and time.time() < deadline, "slot 1 never showed a token"
        status, out = srv.request("GET", f"/slots?model={MODEL}")
        assert status == 200, (status, out[:300])
        slot = {s["id"]: s for s in json.loads(out)}.get(1, {})
        if slot.get("is_processing") and slot.get("next_token", [{}])[0].get("n_decoded", 0) > 0:
            break
        time.sleep(0.05)
    write("slots.generating.json", out)
    done.wait(600)


def main():
    only = set(sys.argv[2:]) if sys.argv[1:2] == ["--only"] else None
    known = set(PAIRS) | set(STREAMS) | set(RAW) | {"reasoning_end", "router", "slots"}
    if (only is not None and not only <= known) or (only is None and len(sys.argv) > 1):
        sys.exit(f"usage: record-fixtures.py [--only NAME...], NAME one of {sorted(known)}")
    wanted = lambda name: only is None or name in only
    srv = Server()
    try:
        for name, body in PAIRS.items():
            if not wanted(name):
                continue
            record_body(srv, name, body)
            status, out = srv.request("POST", "/v1/chat/completions", dict(body, stream=False,
                                       return_progress=False, timings_per_token=False))
            assert status == 200, (name, status, out[:300])
            write(f"{name}.response.json", out)
        for name, body in STREAMS.items():
            if wanted(name):
                record_body(srv, name, body)
        if wanted("reasoning_end"):
            record_reasoning_end(srv)
        for name, (file, request) in RAW.items():
            if wanted(name):
                record_raw_chunked(srv, file, request)
        if wanted("slots"):
            record_slots(srv)
        if wanted("router"):
            record_router(srv)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
