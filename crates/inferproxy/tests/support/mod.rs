//! Test support: the built binary as a child process, loopback TCP upstreams in this process,
//! and a private directory for socket paths. Every wait has a deadline.

#![allow(dead_code)] // Each test file uses a different part of this module.

use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_inferproxy");
/// Generous: the box is shared with parallel builds.
pub const PATIENCE: Duration = Duration::from_secs(10);

static SERIAL: Mutex<()> = Mutex::new(());

/// Tests in one file run one at a time: several measure timing or count threads.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ipx-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A running inferproxy whose stderr lines arrive on a channel. Killed on drop.
pub struct Proxy {
    pub child: Child,
    pub path: PathBuf,
    lines: Receiver<String>,
}

impl Proxy {
    /// Starts the binary and waits for its start line.
    pub fn start(path: &Path, upstream: &str) -> Self {
        Self::start_with_mode(path, upstream, "0600")
    }

    /// [`Proxy::start`] with `--socket-mode mode`.
    pub fn start_with_mode(path: &Path, upstream: &str, mode: &str) -> Self {
        let mut child = Command::new(BIN)
            .args(["--listen".as_ref(), path.as_os_str()])
            .args(["--upstream", upstream])
            .args(["--socket-mode", mode])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut proxy = Self {
            child,
            path: path.to_owned(),
            lines,
        };
        let first = proxy.next_line(PATIENCE).expect("a start line");
        let want = format!(
            "inferproxy 0.1.0: listening on {} (mode {mode}), forwarding to {upstream}",
            path.display()
        );
        assert_eq!(first, want);
        proxy
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn next_line(&mut self, within: Duration) -> Option<String> {
        self.lines.recv_timeout(within).ok()
    }

    /// Every line printed from now until `quiet` passes with no new line.
    pub fn lines_until_quiet(&mut self, quiet: Duration) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(line) = self.next_line(quiet) {
            out.push(line);
        }
        out
    }

    /// Threads of the proxy process.
    pub fn tasks(&self) -> usize {
        fs::read_dir(format!("/proc/{}/task", self.pid()))
            .unwrap()
            .count()
    }

    /// Open file descriptors of the proxy process.
    pub fn fds(&self) -> usize {
        fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .unwrap()
            .count()
    }

    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args([format!("-{name}"), self.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{name}");
    }

    /// Waits for the process to exit, at most `within`.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the binary to its end (at most `PATIENCE`); returns status, stdout and stderr.
pub fn run_to_exit(args: &[&std::ffi::OsStr]) -> (ExitStatus, String, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("inferproxy {args:?} did not exit");
        }
        thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status,
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// A loopback TCP server in this process; each connection runs `handler` on its own thread.
/// Stops accepting when dropped.
pub struct Upstream {
    pub addr: String,
    pub accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl Upstream {
    pub fn start(handler: fn(TcpStream)) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (count, halt) = (accepted.clone(), stop.clone());
        // Polls so that it can stop; the loop ends when the Upstream is dropped.
        let acceptor = thread::spawn(move || {
            while !halt.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        stream.set_nonblocking(false).unwrap();
                        count.fetch_add(1, Ordering::AcqRel);
                        thread::spawn(move || handler(stream));
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(2))
                    }
                    Err(e) => panic!("upstream accept: {e}"),
                }
            }
        });
        Self {
            addr,
            accepted,
            stop,
            acceptor: Some(acceptor),
        }
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Acquire)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}

/// The trailer [`echo`] writes after it has seen the end of the request.
pub const TRAILER: &[u8] = b"<eof seen>";

/// Echoes every byte; after end of stream writes [`TRAILER`] and closes.
pub fn echo(mut s: TcpStream) {
    let _ = s.set_read_timeout(Some(PATIENCE));
    let mut buf = [0u8; 16 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if s.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(_) => return,
        }
    }
    let _ = s.write_all(TRAILER);
    let _ = s.shutdown(Shutdown::Write);
}

/// A loopback port with nobody listening: bound, then released.
pub fn refused_port() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    drop(l);
    addr
}

/// Connects to the proxy with a read timeout of [`PATIENCE`].
pub fn client(path: &Path) -> UnixStream {
    let s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.set_write_timeout(Some(PATIENCE)).unwrap();
    s
}

/// How a connection through the proxy to an [`echo`] upstream went.
#[derive(Debug, PartialEq, Eq)]
pub enum Probe {
    /// The bytes came back.
    Forwarded,
    /// Closed without a byte.
    Closed,
}

/// Sends `ping` and waits for its echo; the stream is returned open when forwarded.
pub fn ping(s: &mut UnixStream) -> Probe {
    // A write to a connection the proxy already closed may fail; the read below tells.
    let _ = s.write_all(b"ping");
    let mut got = Vec::new();
    let mut buf = [0u8; 4];
    while got.len() < 4 {
        match s.read(&mut buf[..4 - got.len()]) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("probe read: {e}"),
        }
    }
    match &got[..] {
        b"ping" => Probe::Forwarded,
        b"" => Probe::Closed,
        other => panic!("probe got {other:?}"),
    }
}

/// Waits until `f` holds, at most `within`; returns whether it did.
pub fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(10));
    }
}
