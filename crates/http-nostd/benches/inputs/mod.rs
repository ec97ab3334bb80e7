//! The inputs of `benches/http.rs` and `examples/count_loop.rs`, so that the criterion figures
//! and the instruction counts measure the same bytes.

/// Heads as llama-server (cpp-httplib) sends them, and a longer one with 20 fields.
pub const HEADS: [(&str, &[u8]); 3] = [
    (
        "sse",
        b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=100\r\nContent-Type: text/event-stream\r\n\
          Server: llama.cpp\r\nTransfer-Encoding: chunked\r\nAccess-Control-Allow-Origin: \r\n\r\n",
    ),
    (
        "json",
        b"HTTP/1.1 200 OK\r\nAccess-Control-Allow-Origin: \r\nContent-Length: 1234\r\n\
          Content-Type: application/json; charset=utf-8\r\nKeep-Alive: timeout=5, max=5\r\n\
          Server: llama.cpp\r\n\r\n",
    ),
    (
        "20-fields",
        b"HTTP/1.1 200 OK\r\nDate: Sun, 29 Nov 2026 17:00:00 GMT\r\nServer: llama.cpp\r\n\
          Content-Type: application/json; charset=utf-8\r\nContent-Length: 1234\r\n\
          Cache-Control: no-cache, no-store, must-revalidate\r\nPragma: no-cache\r\nExpires: 0\r\n\
          Vary: Accept-Encoding\r\nX-Request-Id: 0f8e2c9a-5d4b-4c1e-9a7f-3b2d1e0c9f8a\r\n\
          X-Slot-Id: 3\r\nX-Model: qwen3-30b-a3b-instruct-q4_k_m.gguf\r\n\
          Access-Control-Allow-Origin: *\r\nAccess-Control-Allow-Headers: content-type, authorization\r\n\
          Access-Control-Allow-Methods: GET, POST, OPTIONS\r\nStrict-Transport-Security: max-age=63072000\r\n\
          X-Content-Type-Options: nosniff\r\nX-Frame-Options: DENY\r\nReferrer-Policy: no-referrer\r\n\
          Keep-Alive: timeout=5, max=100\r\nConnection: keep-alive\r\n\r\n",
    ),
];

/// A llama-server-like event: `data: {...}\n\n`, 230 bytes.
pub fn event(i: usize) -> Vec<u8> {
    let mut e = format!(
        "data: {{\"choices\":[{{\"finish_reason\":null,\"index\":0,\"delta\":{{\"content\":\" tok{i:05}\"}}}}],\
         \"created\":1764435600,\"id\":\"chatcmpl-abc\",\"model\":\"qwen\",\"object\":\"chat.completion.chunk\"}}"
    )
    .into_bytes();
    e.resize(228, b' ');
    e.extend_from_slice(b"\n\n");
    e
}

/// `events` events as one chunked response, one event per chunk: the payload bytes, the whole
/// response on the wire, and the length of its head.
pub fn chunked_response(events: usize) -> (Vec<u8>, Vec<u8>, usize) {
    let mut payload = Vec::new();
    let mut wire =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec();
    let head_len = wire.len();
    for i in 0..events {
        let e = event(i);
        assert_eq!(e.len(), 230);
        payload.extend_from_slice(&e);
        wire.extend_from_slice(format!("{:x}\r\n", e.len()).as_bytes());
        wire.extend_from_slice(&e);
        wire.extend_from_slice(b"\r\n");
    }
    wire.extend_from_slice(b"0\r\n\r\n");
    (payload, wire, head_len)
}
