//! The connection cap, the accept rate limit, and what a burst of clients leaves behind.

mod support;

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::{Duration, Instant};

use support::*;

const BUSY: &str = "inferproxy: refused a connection: 8 connections already open";
const RATE: &str = "inferproxy: refused a connection: accept rate limit (burst 10, 2 per second)";

#[test]
fn ninth_concurrent_connection_is_refused() {
    let _s = serial();
    let dir = TempDir::new();
    let path = dir.join("s");
    let up = Upstream::start(echo);
    let mut proxy = Proxy::start(&path, &up.addr);
    let base_tasks = proxy.tasks();
    let mut held: Vec<UnixStream> = (0..8).map(|_| client(&path)).collect();
    for (i, c) in held.iter_mut().enumerate() {
        assert_eq!(ping(c), Probe::Forwarded, "connection {i}");
    }
    // At the limit: two copying threads per connection.
    assert_eq!(proxy.tasks(), base_tasks + 16);
    assert_eq!(ping(&mut client(&path)), Probe::Closed, "the 9th");
    assert_eq!(proxy.next_line(PATIENCE).as_deref(), Some(BUSY));
    // The eight are untouched by the refusal.
    for c in &mut held {
        assert_eq!(ping(c), Probe::Forwarded);
    }
    // One closes; once its threads are gone there is room again (the 10th token).
    let gone = held.pop().unwrap();
    gone.shutdown(Shutdown::Both).unwrap();
    drop(gone);
    assert!(eventually(PATIENCE, || proxy.tasks() == base_tasks + 14));
    assert_eq!(ping(&mut client(&path)), Probe::Forwarded);
}

#[test]
fn burst_of_eleven_refuses_one_then_refills_at_two_per_second() {
    let _s = serial();
    let dir = TempDir::new();
    let path = dir.join("s");
    let up = Upstream::start(echo);
    let mut proxy = Proxy::start(&path, &up.addr);

    // Eleven connects back to back. Each is finished, and its threads gone, before the next
    // so that the connection cap stays out of the way; the bucket starts with ten tokens.
    let base_tasks = proxy.tasks();
    let burst_start = Instant::now();
    let mut outcomes = Vec::new();
    for _ in 0..11 {
        let mut c = client(&path);
        c.shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        let _ = c.read_to_end(&mut got);
        outcomes.push(got == TRAILER);
        assert!(eventually(PATIENCE, || proxy.tasks() == base_tasks));
    }
    let burst_end = Instant::now();
    let mut want = vec![true; 10];
    want.push(false);
    assert_eq!(outcomes, want, "burst took {:?}", burst_end - burst_start);
    assert_eq!(proxy.next_line(PATIENCE).as_deref(), Some(RATE));

    // Then one connect every 50 ms for 3 s: the bucket lets through 2 a second.
    let before = up.accepted();
    let mut last = burst_end;
    for _ in 0..60 {
        thread::sleep(Duration::from_millis(50));
        drop(UnixStream::connect(&path).unwrap());
        last = Instant::now();
    }
    let lines = proxy.lines_until_quiet(Duration::from_millis(500));
    assert!(lines.iter().all(|l| l == BUSY || l == RATE), "{lines:?}");
    // A connection refused by the cap still spent a token: count it as let through.
    let busy = lines.iter().filter(|l| *l == BUSY).count();
    let rate = lines.len() - busy;
    assert!(eventually(PATIENCE, || up.accepted() - before
        + busy
        + rate
        == 60));
    let admitted = (60 - rate) as f64;
    let window = (last - burst_end).as_secs_f64();
    let expected = 2.0 * window;
    // Slack of a token and a half covers the offset between our clock and the proxy's.
    assert!(
        (admitted - expected).abs() <= 1.5,
        "admitted {admitted} in {window:.2} s, expected about {expected:.1}"
    );
}

/// Reads a 4-byte big-endian length, sends that many pattern bytes, ends its side, then
/// waits for the client's end.
fn source(mut s: TcpStream) {
    let _ = s.set_read_timeout(Some(PATIENCE));
    let mut len = [0u8; 4];
    if s.read_exact(&mut len).is_err() {
        return;
    }
    let len = u32::from_be_bytes(len) as usize;
    let chunk: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    let mut left = len.min(8 << 20);
    while left > 0 {
        let n = left.min(chunk.len());
        if s.write_all(&chunk[..n]).is_err() {
            return;
        }
        left -= n;
    }
    let _ = s.shutdown(Shutdown::Write);
    let _ = s.read_to_end(&mut Vec::new());
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Full,
    SlowReader,
    Quitter,
}

/// One load-test client: true if it was forwarded, false if refused; panics on wrong bytes.
fn load_client(path: &std::path::Path, kind: Kind) -> bool {
    const SIZE: usize = 1 << 20;
    let mut c = client(path);
    let want = match kind {
        Kind::Quitter => 4 * SIZE,
        Kind::Full | Kind::SlowReader => SIZE,
    };
    // A refused connection may already be closed; the read tells.
    let _ = c.write_all(&(want as u32).to_be_bytes());
    // Slow readers take small bites so that they stay open for over a second.
    let mut buf = vec![
        0u8;
        if let Kind::SlowReader = kind {
            4096
        } else {
            16 * 1024
        }
    ];
    let mut got = 0usize;
    loop {
        let n = match c.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset && got == 0 => 0,
            Err(e) => panic!("{kind:?} after {got} bytes: {e}"),
        };
        if n == 0 {
            break;
        }
        for (i, b) in buf[..n].iter().enumerate() {
            assert_eq!(
                *b,
                ((got + i) % (64 * 1024) % 251) as u8,
                "{kind:?} at {}",
                got + i
            );
        }
        got += n;
        match kind {
            Kind::SlowReader => thread::sleep(Duration::from_millis(5)),
            Kind::Quitter if got >= 100 * 1024 => return true, // drops mid-stream
            _ => {}
        }
    }
    assert!(got == 0 || got == want, "{kind:?} got {got} of {want}");
    got == want
}

#[test]
fn fifty_clients_leave_no_thread_or_descriptor_behind() {
    let _s = serial();
    let dir = TempDir::new();
    let path = dir.join("s");
    let up = Upstream::start(source);
    let mut proxy = Proxy::start(&path, &up.addr);
    let (base_tasks, base_fds) = (proxy.tasks(), proxy.fds());
    let started = Instant::now();

    let clients: Vec<_> = (0..50)
        .map(|i| {
            let kind = [Kind::Full, Kind::SlowReader, Kind::Quitter][i % 3];
            let path = path.clone();
            // A first wave all at once (meets the cap), then one every 40 ms (meets the rate).
            if i >= 12 {
                thread::sleep(Duration::from_millis(40));
            }
            thread::spawn(move || load_client(&path, kind))
        })
        .collect();
    let forwarded = clients
        .into_iter()
        .map(|c| c.join().unwrap())
        .filter(|&f| f)
        .count();
    let refused = proxy.lines_until_quiet(Duration::from_millis(500));
    assert!(
        refused.iter().all(|l| l == BUSY || l == RATE),
        "{refused:?}"
    );

    let busy = refused.iter().filter(|l| *l == BUSY).count();
    eprintln!(
        "forwarded {forwarded}, busy {busy} of 50 in {:?}",
        started.elapsed()
    );
    assert_eq!(forwarded + refused.len(), 50);
    assert_eq!(up.accepted(), forwarded);
    assert!(forwarded >= 8, "the first wave fills the cap: {forwarded}");
    let clean = eventually(PATIENCE, || {
        proxy.tasks() == base_tasks && proxy.fds() == base_fds
    });
    assert!(
        clean,
        "left behind: {} threads, {} fds (from {base_tasks}, {base_fds})",
        proxy.tasks(),
        proxy.fds()
    );
    assert!(started.elapsed() < Duration::from_secs(60));
}
