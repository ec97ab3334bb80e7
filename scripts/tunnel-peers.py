#!/usr/bin/env python3
"""Both ends of scripts/tunnel-check.sh.

On the "GPU host" side, stand-ins that run until killed:
  serve-http PORT|SOCK            HTTP on 127.0.0.1:PORT (llama-server) or on a Unix socket
                                  made 0600 (inferproxy's in front of it). Each request's
                                  reply: header X-Request-SHA256 (of every byte it received),
                                  body the request body reversed.
  serve-lines SOCK                a Unix socket made 0600, standing in for llama-worker's
                                  status socket: says "hello 7\\n", then answers each line L
                                  with "got L".
On loopd's side, probes through the tunnel; each prints one line, exits 0 when it saw what it
expects and 1 (naming what it saw) otherwise, and none waits longer than its deadline:
  http SOCK                       a 70 KiB binary request; the reply's hash and body exact
  lines SOCK                      the hello, then a line and its answer, exact
  refused SOCK MS                 connect fails (refused, or no file) within MS
  denied SOCK                     connect fails with EACCES (file mode)
  closed SOCK MS                  connect succeeds, then the peer closes with 0 bytes within MS
  banner SOCK                     the first line starts with "SSH-2.0-" (an sshd's port)
  hold SOCK MS                    reads the hello, prints "held", then expects the end of the
                                  stream (EOF or reset) within MS of that
"""

import errno
import hashlib
import os
import socket
import sys
import threading
import time

# Every byte value, more than two 32 KiB SSH channel packets.
BODY = bytes(range(256)) * 280
HELLO = b"hello 7\n"
LINE = b"watch 1 \xc3\xa9\x01\x7f\n"
IO_TIMEOUT_S = 5.0


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    sys.exit(1)


def ms_since(t0):
    return int((time.monotonic() - t0) * 1000)


def recv_all(conn, limit=1 << 20):
    """Everything until EOF, at most IO_TIMEOUT_S in all."""
    data = b""
    deadline = time.monotonic() + IO_TIMEOUT_S
    while len(data) <= limit:
        conn.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = conn.recv(65536)
        except socket.timeout:
            fail(f"no EOF within {IO_TIMEOUT_S} s; got {len(data)} bytes: {data[:120]!r}")
        if not chunk:
            return data
        data += chunk
    fail(f"more than {limit} bytes")


def recv_line(conn):
    data = b""
    conn.settimeout(IO_TIMEOUT_S)
    while not data.endswith(b"\n"):
        try:
            chunk = conn.recv(1)
        except socket.timeout:
            fail(f"no full line within {IO_TIMEOUT_S} s; got {data!r}")
        if not chunk:
            fail(f"EOF inside a line; got {data!r}")
        data += chunk
    return data


def serve_http(where):
    def handle(conn):
        with conn:
            conn.settimeout(IO_TIMEOUT_S)
            got = b""
            while b"\r\n\r\n" not in got:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                got += chunk
            head, _, body = got.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(body) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                body += chunk
                got += chunk
            reply = body[::-1]
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Request-SHA256: %s\r\n"
                b"Connection: close\r\n\r\n" % (len(reply), hashlib.sha256(got).hexdigest().encode())
                + reply
            )

    if where.isdigit():
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", int(where)))
    else:
        os.umask(0o177)
        if os.path.exists(where):
            os.unlink(where)  # left by the stand-in killed before
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(where)
    srv.listen(16)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def serve_lines(path):
    def handle(conn):
        with conn:
            conn.sendall(HELLO)
            buf = b""
            while True:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                buf += chunk
                while b"\n" in buf:
                    line, _, buf = buf.partition(b"\n")
                    conn.sendall(b"got " + line + b"\n")

    os.umask(0o177)  # the socket is made 0600, as the real one is to anyone but its group
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(16)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def connect(path, timeout_s=IO_TIMEOUT_S):
    conn = socket.socket(socket.AF_UNIX)
    conn.settimeout(timeout_s)
    conn.connect(path)
    return conn


def probe_http(path):
    request = (
        b"POST /completion HTTP/1.1\r\nHost: llama\r\nContent-Length: %d\r\n\r\n" % len(BODY)
        + BODY
    )
    with connect(path) as conn:
        conn.sendall(request)
        reply = recv_all(conn)
    head, _, body = reply.partition(b"\r\n\r\n")
    want = hashlib.sha256(request).hexdigest().encode()
    if not head.startswith(b"HTTP/1.1 200 ") or b"X-Request-SHA256: " + want not in head:
        fail(f"reply head {head[:200]!r}, wanted 200 and X-Request-SHA256 {want.decode()}")
    if body != BODY[::-1]:
        fail(f"reply body of {len(body)} bytes is not the {len(BODY)} sent, reversed")
    print(f"{len(request)} bytes sent and received by the server exactly, {len(reply)} back exactly")


def probe_lines(path):
    with connect(path) as conn:
        hello = recv_line(conn)
        if hello != HELLO:
            fail(f"first line {hello!r}, wanted {HELLO!r}")
        conn.sendall(LINE)
        answer = recv_line(conn)
    if answer != b"got " + LINE:
        fail(f"answer {answer!r}, wanted {b'got ' + LINE!r}")
    print(f"hello {hello!r}, sent {LINE!r}, answer {answer!r}")


def probe_refused(path, deadline_ms):
    t0 = time.monotonic()
    try:
        conn = connect(path, deadline_ms / 1000)
    except (ConnectionRefusedError, FileNotFoundError) as e:
        print(f"{errno.errorcode[e.errno]} after {ms_since(t0)} ms")
        return
    except socket.timeout:
        fail(f"connect still pending after {ms_since(t0)} ms")
    conn.close()
    fail(f"connected after {ms_since(t0)} ms")


def probe_denied(path):
    try:
        conn = connect(path)
    except PermissionError as e:
        print(f"{errno.errorcode[e.errno]} as uid {os.getuid()} gid {os.getgid()}")
        return
    conn.close()
    fail(f"connected as uid {os.getuid()} gid {os.getgid()}")


def wait_end(conn, t0, deadline_ms):
    conn.settimeout(deadline_ms / 1000)
    try:
        data = conn.recv(4096)
    except ConnectionResetError:
        return f"reset after {ms_since(t0)} ms"
    except socket.timeout:
        fail(f"still open after {ms_since(t0)} ms")
    if data:
        fail(f"got {data[:120]!r} after {ms_since(t0)} ms, wanted the end of the stream")
    return f"EOF after {ms_since(t0)} ms"


def probe_closed(path, deadline_ms):
    t0 = time.monotonic()
    with connect(path) as conn:
        try:
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: llama\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError) as e:
            # Closed before the request went out: the same answer, sooner.
            print(f"accepted, then {errno.errorcode[e.errno]} on send after {ms_since(t0)} ms")
            return
        print("accepted, then " + wait_end(conn, t0, deadline_ms))


def probe_banner(path):
    with connect(path) as conn:
        line = recv_line(conn)
    if not line.startswith(b"SSH-2.0-"):
        fail(f"first line {line!r}, wanted an SSH banner")
    print(f"first line {line.strip()!r}")


def probe_hold(path, deadline_ms):
    with connect(path) as conn:
        hello = recv_line(conn)
        if hello != HELLO:
            fail(f"first line {hello!r}, wanted {HELLO!r}")
        print("held", flush=True)
        t0 = time.monotonic()
        print(wait_end(conn, t0, deadline_ms), flush=True)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "serve-http":
        serve_http(args[0])
    elif cmd == "serve-lines":
        serve_lines(args[0])
    elif cmd == "http":
        probe_http(args[0])
    elif cmd == "lines":
        probe_lines(args[0])
    elif cmd == "refused":
        probe_refused(args[0], int(args[1]))
    elif cmd == "denied":
        probe_denied(args[0])
    elif cmd == "closed":
        probe_closed(args[0], int(args[1]))
    elif cmd == "banner":
        probe_banner(args[0])
    elif cmd == "hold":
        probe_hold(args[0], int(args[1]))
    else:
        fail(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
