//! The fake llama-server: a Unix socket in a temporary directory, each connection served from
//! a script, every request recorded.
//!
//! A [`Reply`] is a status, headers, and body pieces each sent after a delay, ending in a clean
//! close, a cut connection or silence. Replies are routed by path (`/v1/chat/completions`,
//! `/slots`, ...): each route hands out its replies in order and repeats the last (or starts
//! again, after `cycle_scripts`). Test code may start threads; loopd may not.
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How the body is framed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `Transfer-Encoding: chunked`, one chunk per piece (what llama-server sends for streams).
    Chunked,
    /// `Content-Length` of all pieces together.
    Length,
    /// Neither: the body ends when the connection closes.
    Close,
    /// No head is added: the pieces are the whole response, bytes as given.
    Raw,
}

/// How a reply ends after its last piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The body is completed (last chunk for chunked) and the connection closed.
    Clean,
    /// The connection is closed without completing the body.
    Cut,
    /// Nothing more is sent; the connection stays open until the client goes or the server stops.
    Silence,
}

/// One scripted response.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub framing: Framing,
    /// Each piece is written after its delay.
    pub pieces: Vec<(Duration, Vec<u8>)>,
    pub end: End,
    /// When set, the whole reply (head included) goes out one byte at a time, this far apart.
    pub trickle: Option<Duration>,
}

impl Reply {
    /// A `200` SSE stream of `pieces`, each sent at once, ending clean.
    pub fn sse(pieces: Vec<Vec<u8>>) -> Reply {
        Reply {
            status: 200,
            headers: vec![("Content-Type".into(), "text/event-stream".into())],
            framing: Framing::Chunked,
            pieces: pieces.into_iter().map(|p| (Duration::ZERO, p)).collect(),
            trickle: None,
            end: End::Clean,
        }
    }

    /// A JSON body with `status`.
    pub fn json(status: u16, body: &str) -> Reply {
        Reply {
            status,
            headers: vec![("Content-Type".into(), "application/json".into())],
            framing: Framing::Length,
            pieces: vec![(Duration::ZERO, body.as_bytes().to_vec())],
            trickle: None,
            end: End::Clean,
        }
    }

    /// Bytes sent exactly as given, then a clean close.
    pub fn raw(bytes: Vec<u8>) -> Reply {
        Reply {
            status: 0,
            headers: vec![],
            framing: Framing::Raw,
            pieces: vec![(Duration::ZERO, bytes)],
            trickle: None,
            end: End::Clean,
        }
    }

    /// Accepts the request and says nothing at all.
    pub fn silence() -> Reply {
        Reply {
            status: 0,
            headers: vec![],
            framing: Framing::Raw,
            pieces: vec![],
            trickle: None,
            end: End::Silence,
        }
    }

    /// The same reply ending another way.
    pub fn ending(mut self, end: End) -> Reply {
        self.end = end;
        self
    }

    /// The same reply with `delay` before the first piece.
    pub fn first_after(mut self, delay: Duration) -> Reply {
        if let Some(p) = self.pieces.first_mut() {
            p.0 = delay;
        }
        self
    }

    /// The same reply sent one byte at a time, `every` apart, head included (the delays of
    /// the pieces are ignored).
    pub fn trickled(mut self, every: Duration) -> Reply {
        self.trickle = Some(every);
        self
    }

    /// The same reply with `delay` before every piece.
    pub fn each_after(mut self, delay: Duration) -> Reply {
        for p in &mut self.pieces {
            p.0 = delay;
        }
        self
    }
}

/// A request as the fake server received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Recorded {
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

struct Shared {
    routes: Mutex<HashMap<String, (Vec<Reply>, usize)>>,
    recorded: Mutex<Vec<Recorded>>,
    /// Whether requests are kept in `recorded` (a soak turns this off to measure loopd alone).
    record: AtomicBool,
    /// Whether each route starts its script again after the last reply instead of repeating it.
    cycle: AtomicBool,
    served: AtomicU32,
    /// Replies whose every piece was written (their ending not yet carried out).
    written: AtomicU32,
    stop: AtomicBool,
    hung_up: AtomicU32,
}

/// The fake server; stops and removes its directory on drop.
pub struct FakeServer {
    dir: PathBuf,
    socket: PathBuf,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl FakeServer {
    /// Serves `routes`: `(path, replies)`; an unknown path gets a 404.
    pub fn start(routes: Vec<(&str, Vec<Reply>)>) -> FakeServer {
        let dir = crate::temp_dir("loopd-fake");
        let socket = dir.join("infer.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let shared = Arc::new(Shared {
            routes: Mutex::new(
                routes
                    .into_iter()
                    .map(|(p, r)| (p.to_owned(), (r, 0)))
                    .collect(),
            ),
            recorded: Mutex::new(Vec::new()),
            record: AtomicBool::new(true),
            cycle: AtomicBool::new(false),
            served: AtomicU32::new(0),
            written: AtomicU32::new(0),
            stop: AtomicBool::new(false),
            hung_up: AtomicU32::new(0),
        });
        let s = shared.clone();
        let accept = thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let s = s.clone();
                thread::spawn(move || serve(conn, &s));
            }
        });
        FakeServer {
            dir,
            socket,
            shared,
            accept: Some(accept),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Stops keeping requests (bodies included): [`FakeServer::requests`] is empty from now on
    /// and [`FakeServer::served`] still counts them. For soaks, whose memory bound is loopd's.
    pub fn forget_requests(&self) {
        self.shared.record.store(false, Ordering::SeqCst);
    }

    /// Makes every route start its script again after its last reply.
    pub fn cycle_scripts(&self) {
        self.shared.cycle.store(true, Ordering::SeqCst);
    }

    /// Requests read so far, recorded or not.
    pub fn served(&self) -> u32 {
        self.shared.served.load(Ordering::SeqCst)
    }

    /// Replies written whole so far: every byte of each is in the client's socket.
    pub fn written(&self) -> u32 {
        self.shared.written.load(Ordering::SeqCst)
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.recorded.lock().unwrap().clone()
    }

    /// Connections the client closed while the server still had something to send or was
    /// holding them open (a cancelled or abandoned request).
    pub fn hung_up(&self) -> u32 {
        self.shared.hung_up.load(Ordering::SeqCst)
    }

    /// The bodies of the requests to `path`, in order.
    pub fn bodies_to(&self, path: &str) -> Vec<Vec<u8>> {
        self.requests_to(path).into_iter().map(|r| r.body).collect()
    }

    /// The requests to `path`.
    pub fn requests_to(&self, path: &str) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.path() == path)
            .collect()
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = UnixStream::connect(&self.socket);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Reads one request: head, then a `Content-Length` body.
fn read_request(conn: &mut UnixStream) -> Option<Recorded> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = conn.read(&mut tmp).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let (method, target) = (first.next()?.to_owned(), first.next()?.to_owned());
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let len = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = conn.read(&mut tmp).ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&tmp[..n]);
    }
    Some(Recorded {
        method,
        target,
        headers,
        body,
    })
}

fn next_reply(s: &Shared, path: &str) -> Reply {
    let mut routes = s.routes.lock().unwrap();
    match routes.get_mut(path) {
        Some((replies, next)) if !replies.is_empty() => {
            let i = if s.cycle.load(Ordering::SeqCst) {
                *next % replies.len()
            } else {
                (*next).min(replies.len() - 1)
            };
            let r = replies[i].clone();
            *next += 1;
            r
        }
        _ => Reply::json(404, r#"{"error":{"code":404,"message":"no such route"}}"#),
    }
}

/// Sleeps `d` unless the server stops first.
fn pause(s: &Shared, d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until && !s.stop.load(Ordering::SeqCst) {
        thread::sleep(Duration::from_millis(2).min(until - Instant::now()));
    }
}

fn serve(mut conn: UnixStream, s: &Shared) {
    let Some(req) = read_request(&mut conn) else {
        return;
    };
    let reply = next_reply(s, req.path());
    s.served.fetch_add(1, Ordering::SeqCst);
    if s.record.load(Ordering::SeqCst) {
        s.recorded.lock().unwrap().push(req);
    }
    if write_reply(&mut conn, s, &reply).is_err() {
        s.hung_up.fetch_add(1, Ordering::SeqCst);
        return;
    }
    s.written.fetch_add(1, Ordering::SeqCst);
    match reply.end {
        End::Clean | End::Cut => {}
        End::Silence => {
            // Hold the connection until the client closes it or the server stops.
            let _ = conn.set_read_timeout(Some(Duration::from_millis(5)));
            let mut b = [0u8; 64];
            while !s.stop.load(Ordering::SeqCst) {
                match conn.read(&mut b) {
                    Ok(0) => {
                        s.hung_up.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(_) => break,
                }
            }
        }
    }
}

fn write_reply(conn: &mut impl Sink, s: &Shared, r: &Reply) -> std::io::Result<()> {
    if let Some(every) = r.trickle {
        let mut all = Vec::new();
        let mut whole = r.clone();
        whole.trickle = None;
        for p in &mut whole.pieces {
            p.0 = Duration::ZERO;
        }
        write_reply(&mut all, s, &whole)?;
        for b in all {
            if s.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            conn.write_all(&[b])?;
            pause(s, every);
        }
        return Ok(());
    }
    if r.framing != Framing::Raw {
        let mut head = format!("HTTP/1.1 {} {}\r\n", r.status, reason(r.status));
        for (n, v) in &r.headers {
            head.push_str(&format!("{n}: {v}\r\n"));
        }
        match r.framing {
            Framing::Chunked => head.push_str("Transfer-Encoding: chunked\r\n"),
            Framing::Length => {
                let len: usize = r.pieces.iter().map(|p| p.1.len()).sum();
                head.push_str(&format!("Content-Length: {len}\r\n"));
            }
            Framing::Close | Framing::Raw => {}
        }
        head.push_str("Connection: close\r\n\r\n");
        // The head goes with the first piece, as a server sends it when its first chunk is ready.
        if r.pieces.first().is_none_or(|p| p.0.is_zero()) {
            conn.write_all(head.as_bytes())?;
        } else {
            pause(s, r.pieces[0].0);
            conn.write_all(head.as_bytes())?;
        }
    }
    // Pieces due at the same moment go out in one write, as a server's socket buffer would
    // pass them on; each still is its own chunk.
    let mut pending = Vec::new();
    for (i, (delay, piece)) in r.pieces.iter().enumerate() {
        if (i > 0 || r.framing == Framing::Raw) && !delay.is_zero() {
            conn.write_all(&pending)?;
            pending.clear();
            pause(s, *delay);
        }
        if s.stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        if r.framing == Framing::Chunked {
            if piece.is_empty() {
                continue;
            }
            pending.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
            pending.extend_from_slice(piece);
            pending.extend_from_slice(b"\r\n");
        } else {
            pending.extend_from_slice(piece);
        }
    }
    conn.write_all(&pending)?;
    if r.end == End::Clean && r.framing == Framing::Chunked {
        conn.write_all(b"0\r\n\r\n")?;
    }
    if r.end == End::Cut {
        conn.cut();
    }
    Ok(())
}

/// Where a reply is written: the connection, or a buffer when it is trickled.
trait Sink: Write {
    fn cut(&mut self);
}

impl Sink for UnixStream {
    fn cut(&mut self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }
}

impl Sink for Vec<u8> {
    fn cut(&mut self) {}
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// A recorded SSE body cut into one piece per event (`\n\n`-terminated), as it streamed.
pub fn events_of(body: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 0..body.len().saturating_sub(1) {
        if &body[i..i + 2] == b"\n\n" && i + 2 > start {
            out.push(body[start..i + 2].to_vec());
            start = i + 2;
        }
    }
    if start < body.len() {
        out.push(body[start..].to_vec());
    }
    out
}

/// `/slots` JSON for two slots with slot `busy` processing (or none).
pub fn slots_json(busy: Option<u32>) -> String {
    let slot = |id: u32| {
        format!(
            r#"{{"id":{id},"id_task":-1,"n_ctx":4096,"is_processing":{}}}"#,
            busy == Some(id)
        )
    };
    format!("[{},{}]", slot(0), slot(1))
}

/// The chat-completions path.
pub const CHAT: &str = "/v1/chat/completions";
/// The control path.
pub const CONTROL: &str = "/v1/chat/completions/control";

/// One `data:` event in llama-server's chunk format.
pub fn chunk(delta: &str, finish: Option<&str>, predicted_n: u64) -> Vec<u8> {
    let finish = finish.map_or("null".to_owned(), |f| format!("\"{f}\""));
    format!(
        "data: {{\"choices\":[{{\"finish_reason\":{finish},\"index\":0,\"delta\":{delta}}}],\"created\":1,\"id\":\"chatcmpl-t\",\"model\":\"smollm2\",\"object\":\"chat.completion.chunk\",\"timings\":{{\"cache_n\":0,\"prompt_n\":12,\"predicted_n\":{predicted_n}}}}}\n\n"
    )
    .into_bytes()
}

/// A content delta.
pub fn content(text: &str, n: u64) -> Vec<u8> {
    chunk(&format!("{{\"content\":\"{text}\"}}"), None, n)
}

/// A reasoning delta.
pub fn reasoning(text: &str, n: u64) -> Vec<u8> {
    chunk(&format!("{{\"reasoning_content\":\"{text}\"}}"), None, n)
}

/// The final chunk.
pub fn finish(n: u64) -> Vec<u8> {
    chunk("{}", Some("stop"), n)
}

/// One `data:` event in llama-server's chunk format, `delta` a JSON value (strings escaped by
/// serde_json) and `cache_n` in its timings.
pub fn json_chunk(delta: serde_json::Value, finish: Option<&str>, cache_n: u64) -> Vec<u8> {
    let v = serde_json::json!({
        "choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
        "created": 1, "id": "chatcmpl-r", "model": "smollm2",
        "object": "chat.completion.chunk",
        "timings": {"cache_n": cache_n, "prompt_n": 10, "predicted_n": 3}
    });
    format!("data: {v}\n\n").into_bytes()
}

/// A content delta, escaped by serde_json.
pub fn json_content(text: &str) -> Vec<u8> {
    json_chunk(serde_json::json!({ "content": text }), None, 0)
}

/// A complete answer of `text` without calls, as the runner's tests script it.
pub fn json_answer(text: &str) -> Reply {
    Reply::sse(vec![
        json_content(text),
        json_chunk(serde_json::json!({}), Some("stop"), 5),
        done(),
    ])
}

/// `data: [DONE]`.
pub fn done() -> Vec<u8> {
    b"data: [DONE]\n\n".to_vec()
}

/// `/props` of a server with this chat template, context and slot count, as the self-test
/// reads them.
pub fn props_reply(template: &str, n_ctx: u64, total_slots: u32) -> Reply {
    let body = serde_json::json!({
        "default_generation_settings": {"n_ctx": n_ctx},
        "total_slots": total_slots,
        "chat_template": template,
    });
    Reply::json(200, &body.to_string())
}

/// A streamed answer: one chunk per delta (each a JSON object's text), then the finish with
/// `timings` (`cache_n`, `prompt_n`, `predicted_n`) on every chunk, or on none.
pub fn streamed(deltas: &[&str], finish: &str, timings: Option<(u64, u64, u64)>) -> Reply {
    let timings = timings.map_or(String::new(), |(c, p, n)| {
        format!(r#","timings":{{"cache_n":{c},"prompt_n":{p},"predicted_n":{n}}}"#)
    });
    let mut pieces: Vec<Vec<u8>> = deltas
        .iter()
        .map(|d| {
            format!(r#"data: {{"id":"chatcmpl-s","choices":[{{"index":0,"delta":{d}}}]{timings}}}"#)
                .into_bytes()
        })
        .collect();
    pieces.push(
        format!(
            r#"data: {{"id":"chatcmpl-s","choices":[{{"index":0,"delta":{{}},"finish_reason":"{finish}"}}]{timings}}}"#
        )
        .into_bytes(),
    );
    pieces.push(b"data: [DONE]".to_vec());
    Reply::sse(
        pieces
            .into_iter()
            .map(|mut p| {
                p.extend_from_slice(b"\n\n");
                p
            })
            .collect(),
    )
}

/// "Red, blue", finished.
pub fn answer() -> Reply {
    Reply::sse(vec![
        content("Red", 1),
        content(", blue", 2),
        finish(3),
        done(),
    ])
}

/// A finished command's status, stdout and stderr, for the CLI tests' exact comparisons.
pub fn ran(out: std::process::Output) -> (Option<i32>, String, String) {
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The JSON text of a chat request body's `messages` array, as sent: from its `[` to its `]`.
pub fn raw_messages(body: &[u8]) -> Result<&str, String> {
    let text = std::str::from_utf8(body).map_err(|e| format!("the body is not UTF-8: {e}"))?;
    let key = "\"messages\":";
    let start = text
        .find(key)
        .ok_or_else(|| "the body has no \"messages\"".to_owned())?
        + key.len();
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (i, c) in text[start..].char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_string => escaped = true,
            '"' => in_string = !in_string,
            '[' | '{' if !in_string => depth += 1,
            ']' | '}' if !in_string => {
                depth -= 1;
                if depth == 0 {
                    return Ok(&text[start..start + i + 1]);
                }
            }
            _ => {}
        }
    }
    Err("the messages array does not end".into())
}

/// Whether `next`'s messages extend `prev`'s byte for byte: `prev`'s array without its `]`
/// is where `next`'s begins, and a `,` and more messages follow. The messages added, parsed.
pub fn extension(prev: &[u8], next: &[u8]) -> Result<Vec<serde_json::Value>, String> {
    let (a, b) = (raw_messages(prev)?, raw_messages(next)?);
    let open = &a[..a.len() - 1];
    let Some(rest) = b.strip_prefix(open) else {
        let at = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
        return Err(format!(
            "the messages differ at byte {at}: before {:?}, now {:?}",
            &a[at.saturating_sub(40)..(at + 80).min(a.len())],
            &b[at.saturating_sub(40)..(at + 80).min(b.len())]
        ));
    };
    let added = rest
        .strip_prefix(',')
        .ok_or_else(|| format!("nothing was added after the earlier messages: {rest:?}"))?;
    serde_json::from_str::<Vec<serde_json::Value>>(&format!("[{added}"))
        .map_err(|e| format!("the messages added do not parse: {e}"))
}
