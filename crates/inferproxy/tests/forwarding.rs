//! What happens to the bytes and the ends of a forwarded connection.

mod support;

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use support::*;

/// "Promptly": far below any test timeout, far above scheduling noise.
const PROMPT: Duration = Duration::from_secs(3);

#[test]
fn client_eof_reaches_upstream_which_can_still_reply() {
    let _s = serial();
    let dir = TempDir::new();
    let path = dir.join("s");
    let up = Upstream::start(echo);
    let _proxy = Proxy::start(&path, &up.addr);
    let mut c = client(&path);
    c.write_all(b"hello").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    // The echo upstream writes its trailer only after it read end of stream.
    let mut got = Vec::new();
    c.read_to_end(&mut got).unwrap();
    assert_eq!(got, [&b"hello"[..], TRAILER].concat());
}

/// Where the reverse-direction upstream reports what it received after its own EOF.
static AFTER_EOF: Mutex<Option<mpsc::Sender<Vec<u8>>>> = Mutex::new(None);

fn greet_then_listen(mut s: TcpStream) {
    s.write_all(b"greeting").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    if let Some(tx) = AFTER_EOF.lock().unwrap().as_ref() {
        let _ = tx.send(got);
    }
}

#[test]
fn upstream_eof_reaches_client_which_can_still_send() {
    let _s = serial();
    let (tx, rx) = mpsc::channel();
    *AFTER_EOF.lock().unwrap() = Some(tx);
    let dir = TempDir::new();
    let path = dir.join("s");
    let up = Upstream::start(greet_then_listen);
    let _proxy = Proxy::start(&path, &up.addr);
    let mut c = client(&path);
    let mut got = Vec::new();
    c.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"greeting");
    // The other direction is still open.
    c.write_all(b"still here").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    assert_eq!(rx.recv_timeout(PATIENCE).unwrap(), b"still here");
}

#[test]
fn upstream_refused_closes_the_client_promptly() {
    let _s = serial();
    let dir = TempDir::new();
    let path = dir.join("s");
    let down = refused_port();
    let mut proxy = Proxy::start(&path, &down);
    let started = Instant::now();
    let mut c = client(&path);
    assert_eq!(ping(&mut c), Probe::Closed);
    assert!(started.elapsed() < PROMPT, "{:?}", started.elapsed());
    let line = proxy.next_line(PATIENCE).unwrap();
    let want = format!("inferproxy: closed a connection: upstream {down}: Connection refused");
    assert!(line.starts_with(&want), "{line}");
}

/// Sends part of a reply, then goes away with the request unread: the kernel resets.
fn die_with_reset(mut s: TcpStream) {
    let mut first = [0u8; 1];
    s.read_exact(&mut first).unwrap();
    s.write_all(b"partial").unwrap();
    // Let "partial" leave before the reset overtakes it.
    std::thread::sleep(Duration::from_millis(100));
    drop(s); // unread request bytes remain: RST
}

/// Sends part of a reply, then closes after reading all it was sent: a plain FIN.
fn die_with_fin(mut s: TcpStream) {
    let mut req = [0u8; 4];
    s.read_exact(&mut req).unwrap();
    s.write_all(b"partial").unwrap();
    drop(s);
}

#[test]
fn upstream_reset_mid_stream_closes_the_client_both_ways() {
    let _s = serial();
    let dir = TempDir::new();
    let path = dir.join("s");
    let up = Upstream::start(die_with_reset);
    let _proxy = Proxy::start(&path, &up.addr);
    let mut c = client(&path);
    c.write_all(&[7u8; 1000]).unwrap();
    let started = Instant::now();
    let mut got = Vec::new();
    let end = c.read_to_end(&mut got);
    assert!(started.elapsed() < PROMPT, "{:?}", started.elapsed());
    assert!(
        end.is_ok() || matches!(&end, Err(e) if e.kind() == io::ErrorKind::ConnectionReset),
        "{end:?}"
    );
    assert!(b"partial".starts_with(&got), "{got:?}");
    // Both sides were closed: the client can no longer send either.
    let write_failed = eventually(PROMPT, || c.write_all(b"more").is_err());
    assert!(
        write_failed,
        "client still writable after the upstream reset"
    );
}

#[test]
fn upstream_closing_mid_stream_ends_the_client_stream() {
    let _s = serial();
    let dir = TempDir::new();
    let path = dir.join("s");
    let up = Upstream::start(die_with_fin);
    let _proxy = Proxy::start(&path, &up.addr);
    let mut c = client(&path);
    c.write_all(b"req!").unwrap();
    let started = Instant::now();
    let mut got = Vec::new();
    c.read_to_end(&mut got).unwrap();
    assert!(started.elapsed() < PROMPT, "{:?}", started.elapsed());
    assert_eq!(got, b"partial");
    // The upstream is gone, so sending on fails too once the proxy hits the dead socket.
    let write_failed = eventually(PROMPT, || c.write_all(b"more").is_err());
    assert!(
        write_failed,
        "client still writable after the upstream died"
    );
}

#[test]
fn bytes_arrive_exactly_in_both_directions() {
    let _s = serial();
    let dir = TempDir::new();
    let path = dir.join("s");
    let up = Upstream::start(echo);
    let _proxy = Proxy::start(&path, &up.addr);
    let c = client(&path);
    // 3 MiB of a pattern that is not periodic in the buffer size.
    let data: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let mut w = c.try_clone().unwrap();
    let sent = data.clone();
    let writer = std::thread::spawn(move || {
        w.write_all(&sent).unwrap();
        w.shutdown(Shutdown::Write).unwrap();
    });
    let mut got = Vec::new();
    (&c).read_to_end(&mut got).unwrap();
    writer.join().unwrap();
    assert_eq!(got.len(), data.len() + TRAILER.len());
    assert!(got[..data.len()] == data[..]);
    assert_eq!(&got[data.len()..], TRAILER);
}

#[test]
fn upstream_by_name_tries_each_address() {
    let _s = serial();
    let dir = TempDir::new();
    let path = dir.join("s");
    let up = Upstream::start(echo);
    // `localhost` may resolve to ::1 first, where nobody listens; 127.0.0.1 must still be tried.
    let port = up.addr.rsplit_once(':').unwrap().1;
    let _proxy = Proxy::start(&path, &format!("localhost:{port}"));
    assert_eq!(ping(&mut client(&path)), Probe::Forwarded);
    assert_eq!(up.accepted(), 1);
}

/// Bytes [`stream_32_mib`] sends, in 64 KiB writes.
const STREAMED: usize = 32 << 20;

/// Sends [`STREAMED`] bytes, then waits for the client's end.
fn stream_32_mib(mut s: TcpStream) {
    let _ = s.set_write_timeout(Some(PATIENCE));
    let chunk = [7u8; 64 * 1024];
    for _ in 0..STREAMED / chunk.len() {
        if s.write_all(&chunk).is_err() {
            return;
        }
    }
    let _ = s.read_to_end(&mut Vec::new());
}

/// Times the proxy's thread named `name` has gone to sleep, over all such threads.
fn sleeps_of(proxy: &Proxy, name: &str) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{}/task", proxy.pid())).unwrap();
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).unwrap_or_default()
                == format!("{name}\n")
        })
        .map(|t| {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            let line = status
                .lines()
                .find(|l| l.starts_with("voluntary_ctxt_switches:"))
                .unwrap_or_default()
                .to_owned();
            line.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        })
        .sum()
}

#[test]
fn the_client_reading_does_not_wake_the_thread_that_forwards_its_requests() {
    let _s = serial();
    let dir = TempDir::new();
    let path = dir.join("s");
    let up = Upstream::start(stream_32_mib);
    let proxy = Proxy::start(&path, &up.addr);
    let mut c = client(&path);
    let mut buf = vec![0u8; 64 * 1024];
    c.read_exact(&mut buf).unwrap();
    // Both threads of the connection exist once the first bytes are through.
    let before = sleeps_of(&proxy, "connect");
    let mut got = buf.len();
    while got < STREAMED {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0, "stream ended at {got}");
        got += n;
    }
    let woken = sleeps_of(&proxy, "connect") - before;
    // A blocking read on the Unix socket was woken by nearly every one of the ~500 reads.
    assert!(
        woken <= 2,
        "the client->upstream thread slept {woken} more times"
    );
}
