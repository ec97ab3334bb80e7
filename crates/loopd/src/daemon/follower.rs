//! A follower of a running request: the client connection that streams its events
//! (`submit` with `follow`, or `follow`), as one hub entry ([`Follower`]) and the connection's
//! own side ([`Feed`]).
//!
//! The thread with an event (the request's driver) writes its line to the client's socket
//! itself, without waiting (`MSG_DONTWAIT`), whenever nothing is queued for that follower:
//! an event reaches the client without waking the connection's thread, a hop that cost 3.5
//! to 4 ms at times on a box whose cores the model's threads held (one request in
//! two saw it before its first token). Only what the socket would not take at once (a slow
//! client), and the end line, go through the queue to the connection's thread, which writes
//! them in order and blocks as long as its write deadline allows. `queued` counts the lines
//! handed to the queue and not yet written; a line is written directly only when it is 0, so
//! the order on the socket is the order of the events. It starts at 1 for the reply line
//! (`{"ok":true,"id":N}`) the connection writes first, so no event can come before it.

use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;

use socket2::SockRef;

use super::line::send;
use super::protocol::ProtoError;

/// What the connection's thread writes for its follower: an event line's bytes (or what the
/// socket would not take of one), or the end line.
pub(super) enum Line {
    Event(Vec<u8>),
    End(String),
}

/// A follower as the hub holds it.
pub(super) struct Follower {
    stream: UnixStream,
    tx: SyncSender<Line>,
    queued: Arc<AtomicUsize>,
}

/// The connection's side of a [`Follower`].
pub(super) struct Feed {
    rx: Receiver<Line>,
    queued: Arc<AtomicUsize>,
    capacity: usize,
}

/// A follower of the client on `stream` whose queue holds `capacity` lines: past that it is
/// dropped (it fell behind).
pub(super) fn follower(stream: &UnixStream, capacity: usize) -> io::Result<(Follower, Feed)> {
    let (tx, rx) = sync_channel(capacity);
    let queued = Arc::new(AtomicUsize::new(1));
    let follower = Follower {
        stream: stream.try_clone()?,
        tx,
        queued: queued.clone(),
    };
    Ok((
        follower,
        Feed {
            rx,
            queued,
            capacity,
        },
    ))
}

impl Follower {
    /// Hands `line` (its newline included, made once for every follower) to the client:
    /// written at once if nothing is queued and the socket takes it, else what is left of it
    /// is copied into the queue for the connection's thread. `false` when the follower is to
    /// be dropped: its client went, or its queue is full.
    pub fn offer(&self, line: &[u8]) -> bool {
        let mut sent = 0;
        if self.queued.load(Ordering::SeqCst) == 0 {
            let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
            match SockRef::from(&self.stream).send_with_flags(line, flags) {
                Ok(n) if n == line.len() => return true,
                Ok(n) => sent = n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) => {}
                Err(_) => return false,
            }
        }
        self.queue(Line::Event(line[sent..].to_vec()))
    }

    /// Queues the end line; whether the connection's thread can still take it.
    pub fn end(&self, line: String) -> bool {
        self.queue(Line::End(line))
    }

    fn queue(&self, line: Line) -> bool {
        self.queued.fetch_add(1, Ordering::SeqCst);
        if self.tx.try_send(line).is_ok() {
            return true;
        }
        self.queued.fetch_sub(1, Ordering::SeqCst);
        false
    }
}

impl Feed {
    /// Writes the reply line that opens the stream; events may be written directly from now.
    pub fn open(&self, stream: &UnixStream, reply: &str) -> io::Result<()> {
        let sent = send(stream, reply);
        self.queued.fetch_sub(1, Ordering::SeqCst);
        sent
    }

    /// Writes what is queued, in order, until the end line (or until the hub drops the
    /// follower: it fell `capacity` lines behind).
    pub fn pass_on(self, stream: &UnixStream) -> io::Result<()> {
        loop {
            match self.rx.recv() {
                Ok(Line::Event(bytes)) => {
                    let written = (&*stream).write_all(&bytes);
                    self.queued.fetch_sub(1, Ordering::SeqCst);
                    written?;
                }
                Ok(Line::End(l)) => return send(stream, &l),
                Err(_) => {
                    return send(
                        stream,
                        &ProtoError::FollowerDropped(self.capacity).to_line(),
                    )
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};

    fn lines(stream: UnixStream) -> Vec<String> {
        BufReader::new(stream).lines().map(Result::unwrap).collect()
    }

    #[test]
    fn nothing_goes_before_the_reply_line_then_events_are_written_at_once_in_order() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (f, feed) = follower(&ours, 4).unwrap();
        // Before the reply: queued for the connection's thread.
        assert!(f.offer(b"e1\n"));
        assert_eq!(f.queued.load(Ordering::SeqCst), 2);
        feed.open(&ours, "ok").unwrap();
        // e1 is still queued: e2 queues behind it.
        assert!(f.offer(b"e2\n"));
        assert_eq!(f.queued.load(Ordering::SeqCst), 2);
        assert!(f.end("end".into()));
        let t = std::thread::spawn(move || feed.pass_on(&ours));
        t.join().unwrap().unwrap();
        drop(f);
        assert_eq!(lines(theirs), ["ok", "e1", "e2", "end"]);
    }

    #[test]
    fn with_nothing_queued_an_event_is_on_the_socket_before_the_connection_thread_runs() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (f, feed) = follower(&ours, 4).unwrap();
        feed.open(&ours, "ok").unwrap();
        assert!(f.offer(b"e1\n"));
        assert!(f.offer(b"e2\n"));
        assert_eq!(f.queued.load(Ordering::SeqCst), 0, "nothing queued");
        assert!(f.end("end".into()));
        drop(f);
        feed.pass_on(&ours).unwrap();
        drop(ours);
        assert_eq!(lines(theirs), ["ok", "e1", "e2", "end"]);
    }

    #[test]
    fn what_a_full_socket_does_not_take_is_queued_and_written_whole_after() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (f, feed) = follower(&ours, 64).unwrap();
        feed.open(&ours, "ok").unwrap();
        // Lines until the socket's buffer is full and one is cut or queued.
        let line = "x".repeat(8 * 1024);
        let mut n = 0;
        while f.queued.load(Ordering::SeqCst) == 0 {
            assert!(f.offer(format!("{n} {line}\n").as_bytes()));
            n += 1;
            assert!(n < 10_000, "the socket never filled");
        }
        assert!(f.offer(format!("{n} {line}\n").as_bytes()));
        assert!(f.end("end".into()));
        drop(f);
        let reader = std::thread::spawn(move || lines(theirs));
        feed.pass_on(&ours).unwrap();
        drop(ours);
        let got = reader.join().unwrap();
        let want: Vec<String> = std::iter::once("ok".to_owned())
            .chain((0..=n).map(|k| format!("{k} {line}")))
            .chain(std::iter::once("end".to_owned()))
            .collect();
        assert_eq!(got.len(), want.len());
        assert!(got == want, "lines out of order or cut");
    }

    #[test]
    fn a_follower_whose_client_went_is_dropped_and_a_full_queue_drops_it() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (f, feed) = follower(&ours, 1).unwrap();
        feed.open(&ours, "ok").unwrap();
        drop(theirs);
        assert!(!f.offer(b"e1\n"), "the client went");
        let (ours, _theirs) = UnixStream::pair().unwrap();
        let (f, _feed) = follower(&ours, 1).unwrap();
        // The reply not yet written: events queue, and the second finds the queue full.
        assert!(f.offer(b"e1\n"));
        assert!(!f.offer(b"e2\n"));
    }
}
