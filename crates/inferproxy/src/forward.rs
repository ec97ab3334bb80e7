//! One forwarded connection: one TCP connection upstream and two copying threads.
//!
//! Promise: bytes are copied as they come, never looked at. An end of stream from one side
//! becomes `shutdown(Write)` on the other and the opposite direction keeps flowing. A read or
//! write error on either side shuts both sockets down, which wakes the other thread; the
//! connection's [`Slot`] is given back only when both threads are done and every descriptor of
//! the connection is closed.
//!
//! The thread that reads the Unix socket waits in `poll(2)` for input before each read, and is
//! woken only by input. A thread asleep in `read` on a Unix socket is also woken each time the
//! client reads (the client freeing buffer space wakes every sleeper on that socket, and a
//! blocking read does not filter by event), which cost a wake-up per event streamed to the
//! client: about 12,000 per GiB of bulk, each a cross-CPU interrupt when that thread's CPU is idle.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags};
use rustix::io::Errno;

/// Bytes moved per read/write; one such buffer per direction.
pub const COPY_BUFFER: usize = 64 * 1024;
/// Stack of the thread that connects upstream: name resolution may go through NSS modules.
pub const CONNECT_STACK: usize = 256 * 1024;
/// Stack of the thread that only copies (its buffer is on the heap).
pub const COPY_STACK: usize = 64 * 1024;
/// How long an upstream that does not answer at all is waited for, per address.
pub const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Counts open connections; each [`Slot`] is one of them.
#[derive(Debug, Clone, Default)]
pub struct OpenCount(Arc<AtomicUsize>);

impl OpenCount {
    /// Connections open now. Only the accept thread adds, so the value can only be stale high.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }

    /// Counts one more open connection until the returned slot is dropped.
    pub fn enter(&self) -> Slot {
        self.0.fetch_add(1, Ordering::AcqRel);
        Slot(self.0.clone())
    }
}

/// One open connection; dropping it gives the place back.
#[derive(Debug)]
pub struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Starts forwarding `client` to `upstream` (`host:port`). The only error is failing to start
/// the thread, in which case `client` has been closed.
pub fn spawn(client: UnixStream, upstream: Arc<str>, slot: Slot) -> io::Result<()> {
    thread::Builder::new()
        .name("connect".into())
        .stack_size(CONNECT_STACK)
        .spawn(move || connect_and_copy(client, &upstream, slot))
        .map(drop)
}

fn connect_and_copy(client: UnixStream, upstream: &str, slot: Slot) {
    let server = match connect(upstream) {
        Ok(server) => server,
        Err(e) => {
            let _ = client.shutdown(Shutdown::Both);
            drop(client);
            eprintln!("inferproxy: closed a connection: upstream {upstream}: {e}");
            return;
        }
    };
    // Requests and small deltas must not wait for Nagle's algorithm.
    let _ = server.set_nodelay(true);
    let (client_back, server_back) = match (client.try_clone(), server.try_clone()) {
        (Ok(c), Ok(s)) => (c, s),
        (Err(e), _) | (_, Err(e)) => {
            close_both(&client, &server);
            eprintln!("inferproxy: closed a connection: {e}");
            return;
        }
    };
    let slot = Arc::new(slot);
    let back_slot = slot.clone();
    // The request goes upstream only once the thread that copies the answer back is up, its
    // buffer made: started later, its start-up ran beside the server's prompt evaluation,
    // which on a box whose cores the model's threads fill costs the first token a scheduler
    // slice.
    let (up, is_up) = std::sync::mpsc::sync_channel::<()>(1);
    let back = thread::Builder::new()
        .name("copy".into())
        .stack_size(COPY_STACK)
        .spawn(move || {
            copy_half_when(server_back, client_back, || {
                let _ = up.send(());
            });
            drop(back_slot);
        });
    if let Err(e) = back {
        close_both(&client, &server);
        eprintln!("inferproxy: closed a connection: cannot start a thread: {e}");
        return;
    }
    // Gone without a word only if that thread ended at once; the copy below then fails.
    let _ = is_up.recv();
    copy_half(client, server);
}

fn connect(upstream: &str) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "name resolved to no address");
    for addr in upstream.to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, UPSTREAM_CONNECT_TIMEOUT) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// What bytes are copied from.
trait Source: Read {
    /// Returns once a read would not block (input, end of stream or an error is waiting), or
    /// at once if the read itself may be left to wait.
    fn wait_readable(&self) -> io::Result<()> {
        Ok(())
    }
}

impl Source for UnixStream {
    /// `poll` for input only: see the module docs for the wake-ups a blocking read gets here.
    fn wait_readable(&self) -> io::Result<()> {
        loop {
            match poll(&mut [PollFd::new(self, PollFlags::IN)], None) {
                Ok(_) => return Ok(()),
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// A TCP socket is woken for input only (and for room to write only when a writer waits).
impl Source for TcpStream {}

/// A socket that can be half-closed; both socket types the forwarder joins.
trait HalfClose: Source + Write {
    fn shut(&self, how: Shutdown) -> io::Result<()>;
}

impl HalfClose for UnixStream {
    fn shut(&self, how: Shutdown) -> io::Result<()> {
        self.shutdown(how)
    }
}

impl HalfClose for TcpStream {
    fn shut(&self, how: Shutdown) -> io::Result<()> {
        self.shutdown(how)
    }
}

/// Copies `from` into `to` until `from` ends, then half-closes `to`; on any error closes both.
fn copy_half(from: impl HalfClose, to: impl HalfClose) {
    copy_half_when(from, to, || {});
}

/// [`copy_half`], calling `ready` once its buffer is made, before the first read.
fn copy_half_when(mut from: impl HalfClose, mut to: impl HalfClose, ready: impl FnOnce()) {
    let mut buf = vec![0u8; COPY_BUFFER];
    ready();
    let ended = pass(&mut from, &mut to, &mut buf).and_then(|()| to.shut(Shutdown::Write));
    if ended.is_err() {
        close_both(&from, &to);
    }
}

fn close_both(a: &impl HalfClose, b: &impl HalfClose) {
    // Errors mean the socket is already down, which is the goal.
    let _ = a.shut(Shutdown::Both);
    let _ = b.shut(Shutdown::Both);
}

/// Copies until end of stream (`Ok`) or the first error.
fn pass(from: &mut impl Source, to: &mut impl Write, buf: &mut [u8]) -> io::Result<()> {
    loop {
        from.wait_readable()?;
        let n = match from.read(buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Source for &[u8] {}

    #[test]
    fn slot_counts_until_dropped() {
        let open = OpenCount::default();
        let a = open.enter();
        let b = open.enter();
        assert_eq!(open.get(), 2);
        drop(a);
        assert_eq!(open.get(), 1);
        drop(b);
        assert_eq!(open.get(), 0);
    }

    #[test]
    fn pass_copies_exact_bytes_across_buffer_boundaries() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let mut out = Vec::new();
        let mut buf = [0u8; 333];
        pass(&mut &data[..], &mut out, &mut buf).unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn pass_reports_a_write_error() {
        struct Full;
        impl Write for Full {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut buf = [0u8; 8];
        let err = pass(&mut &b"abc"[..], &mut Full, &mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }
}
