//! One forwarded connection: one TCP connection upstream and one thread that copies both ways.
//!
//! Promise: bytes are copied as they come, never looked at. An end of stream from one side
//! becomes `shutdown(Write)` on the other and the opposite direction keeps flowing. A read or
//! write error on either side shuts both sockets down; the connection's [`Slot`] is given back
//! only when its thread is done and both descriptors are closed.
//!
//! Why one thread and `poll(2)`, not a blocking thread per direction: a thread asleep in `read`
//! on the Unix socket is woken each time the client reads (the kernel wakes every sleeper on the
//! socket when the client frees buffer space, and a blocking read does not filter by event), and
//! a round trip then wakes two threads instead of one thread twice. `poll` wakes only for what
//! was asked; measured in `docs/benchmarks/inferproxy.md`.

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
/// Stack of a connection's thread: name resolution may go through NSS modules. The copy
/// buffers are on the heap.
pub const CONNECTION_STACK: usize = 256 * 1024;
/// Reads that filled the buffer, in a row, after which the sockets are polled anyway.
pub const FULL_READS_BEFORE_POLL: u32 = 8;
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
        .name("connection".into())
        .stack_size(CONNECTION_STACK)
        .spawn(move || {
            connect_and_copy(client, &upstream);
            drop(slot);
        })
        .map(drop)
}

fn connect_and_copy(client: UnixStream, upstream: &str) {
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
    if let Err(e) = client
        .set_nonblocking(true)
        .and_then(|()| server.set_nonblocking(true))
    {
        close_both(&client, &server);
        eprintln!("inferproxy: closed a connection: {e}");
        return;
    }
    if copy_both(&client, &server).is_err() {
        close_both(&client, &server);
    }
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

/// A socket that can be half-closed; both socket types the forwarder joins.
trait HalfClose {
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

impl<T: HalfClose> HalfClose for &T {
    fn shut(&self, how: Shutdown) -> io::Result<()> {
        (**self).shut(how)
    }
}

fn close_both(a: &impl HalfClose, b: &impl HalfClose) {
    // Errors mean the socket is already down, which is the goal.
    let _ = a.shut(Shutdown::Both);
    let _ = b.shut(Shutdown::Both);
}

/// Copies both ways between two non-blocking sockets until both directions have ended (`Ok`)
/// or the first error.
fn copy_both(client: &UnixStream, server: &TcpStream) -> io::Result<()> {
    let mut up = Half::new(); // client -> server
    let mut down = Half::new(); // server -> client
    let (mut client_ready, mut server_ready) = (PollFlags::empty(), PollFlags::empty());
    let mut unpolled = 0;
    loop {
        up.step(&mut &*client, &mut &*server, client_ready, server_ready)?;
        down.step(&mut &*server, &mut &*client, server_ready, client_ready)?;
        if up.is_closed() && down.is_closed() {
            return Ok(());
        }
        // A read that filled the buffer most likely left more behind: read again without a
        // poll, a bounded number of times so that the other direction is still looked at.
        if unpolled < FULL_READS_BEFORE_POLL && (up.more_waiting() || down.more_waiting()) {
            unpolled += 1;
            client_ready = if up.more_waiting() {
                PollFlags::IN
            } else {
                PollFlags::empty()
            };
            server_ready = if down.more_waiting() {
                PollFlags::IN
            } else {
                PollFlags::empty()
            };
            continue;
        }
        unpolled = 0;
        let client_wants = up.read_interest() | down.write_interest();
        let server_wants = down.read_interest() | up.write_interest();
        // A socket nothing is wanted from stays out: it would report a hang-up forever.
        let mut fds = [
            PollFd::new(client, client_wants),
            PollFd::new(server, server_wants),
        ];
        let (first, len) = match (client_wants.is_empty(), server_wants.is_empty()) {
            (false, false) => (0, 2),
            (false, true) => (0, 1),
            (true, _) => (1, 1),
        };
        match poll(&mut fds[first..first + len], None) {
            Ok(_) => {}
            Err(Errno::INTR) => {
                (client_ready, server_ready) = (PollFlags::empty(), PollFlags::empty());
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        client_ready = if client_wants.is_empty() {
            PollFlags::empty()
        } else {
            fds[0].revents()
        };
        server_ready = if server_wants.is_empty() {
            PollFlags::empty()
        } else {
            fds[1].revents()
        };
    }
}

/// What [`Half`] does after it has read an end of stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Open,
    /// End of stream read; `shutdown(Write)` follows once the buffer is written.
    Ended,
    /// End of stream passed on.
    Closed,
}

/// One direction: bytes read from one socket and not yet written to the other.
#[derive(Debug)]
struct Half {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    flow: Flow,
    /// The last read filled the buffer.
    full: bool,
}

impl Half {
    fn new() -> Self {
        Self {
            buf: vec![0; COPY_BUFFER].into_boxed_slice(),
            start: 0,
            end: 0,
            flow: Flow::Open,
            full: false,
        }
    }

    fn read_interest(&self) -> PollFlags {
        if self.start == self.end && self.flow == Flow::Open {
            PollFlags::IN
        } else {
            PollFlags::empty()
        }
    }

    fn write_interest(&self) -> PollFlags {
        if self.start < self.end {
            PollFlags::OUT
        } else {
            PollFlags::empty()
        }
    }

    /// The last read filled the buffer, and all of it has been written.
    fn more_waiting(&self) -> bool {
        self.full && !self.read_interest().is_empty()
    }

    fn is_closed(&self) -> bool {
        self.flow == Flow::Closed
    }

    /// Reads once if `from` is ready and the buffer is empty, writes what it holds, and passes
    /// an end of stream on once everything before it is written. `*_ready` are poll results:
    /// a hang-up or error counts as ready, so that the read or write reports it.
    fn step(
        &mut self,
        from: &mut impl Read,
        to: &mut (impl Write + HalfClose),
        from_ready: PollFlags,
        to_ready: PollFlags,
    ) -> io::Result<()> {
        let mut fresh = false;
        if !self.read_interest().is_empty() && from_ready.intersects(READABLE) {
            self.full = false;
            match retry(|| from.read(&mut self.buf)) {
                Ok(0) => self.flow = Flow::Ended,
                Ok(n) => {
                    (self.start, self.end, fresh, self.full) = (0, n, true, n == self.buf.len())
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        // Right after a read the other socket almost always has room: write without asking.
        if fresh || to_ready.intersects(WRITABLE) {
            while self.start < self.end {
                match retry(|| to.write(&self.buf[self.start..self.end])) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => self.start += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
        }
        if self.flow == Flow::Ended && self.start == self.end {
            to.shut(Shutdown::Write)?;
            self.flow = Flow::Closed;
        }
        Ok(())
    }
}

const READABLE: PollFlags = PollFlags::IN.union(PollFlags::HUP).union(PollFlags::ERR);
const WRITABLE: PollFlags = PollFlags::OUT.union(PollFlags::HUP).union(PollFlags::ERR);

fn retry(mut op: impl FnMut() -> io::Result<usize>) -> io::Result<usize> {
    loop {
        match op() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Hands out scripted reads: bytes, `None` for `WouldBlock`; end of stream after the script.
    struct Source(Vec<Option<Vec<u8>>>);

    impl Read for Source {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.0.is_empty() {
                return Ok(0);
            }
            match self.0.remove(0) {
                None => Err(io::ErrorKind::WouldBlock.into()),
                Some(mut bytes) => {
                    let n = bytes.len().min(buf.len());
                    buf[..n].copy_from_slice(&bytes[..n]);
                    if n < bytes.len() {
                        self.0.insert(0, Some(bytes.split_off(n)));
                    }
                    Ok(n)
                }
            }
        }
    }

    /// Takes at most `per_call` bytes a call and says `WouldBlock` every `block_every`-th call;
    /// records what it got and when it was shut.
    struct Sink {
        got: Vec<u8>,
        per_call: usize,
        block_every: usize,
        calls: usize,
        shut_after: Option<usize>,
        error: Option<io::ErrorKind>,
    }

    impl Sink {
        fn new(per_call: usize, block_every: usize) -> Self {
            Self {
                got: Vec::new(),
                per_call,
                block_every,
                calls: 0,
                shut_after: None,
                error: None,
            }
        }
    }

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if let Some(kind) = self.error {
                return Err(kind.into());
            }
            self.calls += 1;
            if self.calls.is_multiple_of(self.block_every) {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = buf.len().min(self.per_call);
            self.got.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl HalfClose for Sink {
        fn shut(&self, how: Shutdown) -> io::Result<()> {
            assert_eq!(how, Shutdown::Write);
            Ok(())
        }
    }

    /// Steps `half` with both sides always ready until it has passed the end of stream on.
    fn run(half: &mut Half, from: &mut Source, to: &mut Sink) -> io::Result<usize> {
        let mut steps = 0;
        while !half.is_closed() {
            steps += 1;
            assert!(steps < 100_000, "no progress");
            half.step(from, to, PollFlags::IN, PollFlags::OUT)?;
            if half.is_closed() {
                to.shut_after = Some(to.got.len());
            }
        }
        Ok(steps)
    }

    #[test]
    fn half_copies_exact_bytes_through_short_writes_and_would_block() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
        let mut script = Vec::new();
        for (i, chunk) in data.chunks(70_001).enumerate() {
            script.push(Some(chunk.to_vec()));
            if i % 2 == 0 {
                script.push(None);
            }
        }
        let (mut from, mut to) = (Source(script), Sink::new(333, 3));
        let mut half = Half::new();
        run(&mut half, &mut from, &mut to).unwrap();
        assert_eq!(to.got, data);
        assert_eq!(to.shut_after, Some(data.len()));
    }

    #[test]
    fn end_of_stream_is_passed_on_only_after_the_bytes_before_it() {
        let mut from = Source(vec![Some(b"abc".to_vec())]);
        let mut to = Sink::new(1, 2);
        let mut half = Half::new();
        // Reads "abc", writes "a", then the sink blocks.
        half.step(&mut from, &mut to, PollFlags::IN, PollFlags::empty())
            .unwrap();
        assert_eq!((to.got.as_slice(), half.is_closed()), (&b"a"[..], false));
        // Nothing more is read while bytes are waiting; the socket is not asked for them.
        assert_eq!(half.read_interest(), PollFlags::empty());
        assert_eq!(half.write_interest(), PollFlags::OUT);
        half.step(&mut from, &mut to, PollFlags::IN, PollFlags::empty())
            .unwrap();
        assert_eq!(to.got, b"a");
        to.block_every = usize::MAX;
        half.step(&mut from, &mut to, PollFlags::empty(), PollFlags::OUT)
            .unwrap();
        assert_eq!((to.got.as_slice(), half.is_closed()), (&b"abc"[..], false));
        // Now the end of stream is read and passed on.
        half.step(&mut from, &mut to, PollFlags::IN, PollFlags::empty())
            .unwrap();
        assert!(half.is_closed());
        assert_eq!(
            half.read_interest() | half.write_interest(),
            PollFlags::empty()
        );
    }

    #[test]
    fn only_a_read_that_filled_the_buffer_is_followed_by_another_without_poll() {
        let mut from = Source(vec![
            Some(vec![1; COPY_BUFFER]),
            Some(vec![2; COPY_BUFFER - 1]),
        ]);
        let mut to = Sink::new(COPY_BUFFER, usize::MAX);
        let mut half = Half::new();
        half.step(&mut from, &mut to, PollFlags::IN, PollFlags::empty())
            .unwrap();
        assert!(half.more_waiting());
        half.step(&mut from, &mut to, PollFlags::IN, PollFlags::empty())
            .unwrap();
        assert!(!half.more_waiting());
        assert_eq!(to.got.len(), 2 * COPY_BUFFER - 1);
        // Not while what was read is still waiting to be written.
        let mut from = Source(vec![Some(vec![3; COPY_BUFFER])]);
        let mut to = Sink::new(1, 2);
        half.step(&mut from, &mut to, PollFlags::IN, PollFlags::empty())
            .unwrap();
        assert!(!half.more_waiting());
    }

    #[test]
    fn a_hang_up_counts_as_ready() {
        let mut from = Source(vec![Some(b"xy".to_vec())]);
        let mut to = Sink::new(100, 100);
        let mut half = Half::new();
        half.step(&mut from, &mut to, PollFlags::HUP, PollFlags::empty())
            .unwrap();
        assert_eq!(to.got, b"xy");
        half.step(&mut from, &mut to, PollFlags::ERR, PollFlags::empty())
            .unwrap();
        assert!(half.is_closed());
    }

    #[test]
    fn nothing_is_read_when_poll_did_not_say_so() {
        let mut from = Source(vec![Some(b"xy".to_vec())]);
        let mut to = Sink::new(100, 100);
        let mut half = Half::new();
        half.step(&mut from, &mut to, PollFlags::OUT, PollFlags::OUT)
            .unwrap();
        assert_eq!((to.got.len(), from.0.len()), (0, 1));
    }

    #[test]
    fn a_write_error_is_returned() {
        let mut from = Source(vec![Some(b"abc".to_vec())]);
        let mut to = Sink::new(100, 100);
        to.error = Some(io::ErrorKind::BrokenPipe);
        let err = Half::new()
            .step(&mut from, &mut to, PollFlags::IN, PollFlags::OUT)
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }

    #[test]
    fn a_read_error_is_returned() {
        struct Reset;
        impl Read for Reset {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::ErrorKind::ConnectionReset.into())
            }
        }
        let err = Half::new()
            .step(
                &mut Reset,
                &mut Sink::new(1, 2),
                PollFlags::IN,
                PollFlags::OUT,
            )
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
    }
}
