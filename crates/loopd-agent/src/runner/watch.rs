//! The runner's `watch` connection to llama-worker. One thread per runner keeps it open (the
//! worker forgets every registered generation when no watch is open), opens a new one
//! `runner.worker_poll_ms` after it is lost (no line for 3 s, the end of the stream, a refused
//! connection), and hands each pushed `failed <id> <reason>` to the driver of the request that
//! registered generation `id`, which ends it at once. A failure pushed for an id no driver has
//! routed (yet) is dropped: the request's status poll still sees the restart.
//!
//! Each host of the runner has its own watch. Every connect, line and loss is also handed to
//! the runner's health thread (`hosts.rs`), which decides what the host's silence means; when
//! it takes the host for lost it asks this thread to drop the connection ([`Watch::renew`])
//! and open a new one, whose `ready` alone makes the host ready again.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use socket2::SockRef;

use super::health_queue::Input;
use super::lock;
use super::worker::{self, WatchEvent, WorkerError, WorkerFailReason, WorkerState};
use crate::fleet::HostId;

/// What ends a request from outside its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Notice {
    /// The worker failed generation `id` (pushed on the watch), with this reason.
    Failed(u64, WorkerFailReason),
    /// The request's host was lost; the words say how.
    HostLost(String),
    /// The request's host refused the connect of a generation never sent, and the request
    /// was placed on `slot` of host `host` (its index) instead.
    Rehomed {
        /// The new host's index.
        host: usize,
        /// The server slot there.
        slot: u32,
    },
}

/// Where a watch's connects, lines and losses go: the health thread's queue.
pub(super) type Feed = (HostId, std::sync::mpsc::Sender<Input>);

/// The routes from generation ids to their drivers, shared with the watch thread.
pub(super) struct Watch {
    routes: Mutex<HashMap<u64, Sender<Notice>>>,
    /// The open connection's id (its `hello`), which each registration names so that it
    /// belongs to this connection; `None` before the hello and once the connection is lost.
    id: Mutex<Option<u64>>,
    /// The worker's state and spawn count as the open connection last pushed them (the
    /// worker writes a `state` line after its hello and at every change); `None` before that
    /// line and once the connection is lost or renewed.
    state: Mutex<Option<(WorkerState, u64)>>,
    /// The open connection's socket, for [`Watch::current_state`] to see whether bytes wait
    /// in it unread.
    socket: Mutex<Option<UnixStream>>,
    /// The thread is reading or applying a line: the state may be about to change.
    reading: AtomicBool,
    stop: AtomicBool,
    /// Drop the open connection at its next line and open a new one.
    renew: AtomicBool,
    feed: Option<Mutex<Feed>>,
}

impl Watch {
    /// Starts the watch thread on `socket`; `timeout` bounds connecting and writing, `retry`
    /// is the wait before a new connection. `None` when no thread could be started (then
    /// only the status poll sees restarts).
    /// `feed`, when given, hears every connect, line and loss.
    pub(super) fn start(
        socket: PathBuf,
        timeout: Duration,
        retry: Duration,
        feed: Option<Feed>,
    ) -> Option<Arc<Watch>> {
        let w = Arc::new(Watch {
            routes: Mutex::new(HashMap::new()),
            id: Mutex::new(None),
            state: Mutex::new(None),
            socket: Mutex::new(None),
            reading: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            renew: AtomicBool::new(false),
            feed: feed.map(Mutex::new),
        });
        let t = w.clone();
        std::thread::Builder::new()
            .name("loopd-watch".into())
            .spawn(move || t.run(&socket, timeout, retry))
            .ok()?;
        Some(w)
    }

    /// Sends failures pushed for generation `id` to `to`.
    pub(super) fn route(&self, id: u64, to: Sender<Notice>) {
        lock(&self.routes).insert(id, to);
    }

    /// The open watch connection's id, for `register <slot> <watch>`.
    pub(super) fn id(&self) -> Option<u64> {
        *lock(&self.id)
    }

    /// The worker's state and spawn count as its open watch last pushed them: what a
    /// `status` round trip would answer, short of a change whose line is still on its way
    /// (a window the round trip has too: the state can change the moment after it answers).
    /// `None` while no watch is open or it has said no state yet: then ask.
    pub(super) fn state(&self) -> Option<(WorkerState, u64)> {
        *lock(&self.state)
    }

    /// The worker's state and spawn count as its open watch last pushed them, when nothing
    /// it wrote before this call is still unread or being applied: then this is the state of
    /// every command the worker answered before (it writes a changed state on each watch
    /// before it answers `start` or `stop`). `None` when a line may be on its way in, or no
    /// watch has said a state: then ask.
    pub(super) fn current_state(&self) -> Option<(WorkerState, u64)> {
        let socket = lock(&self.socket);
        let mut byte = [MaybeUninit::<u8>::uninit()];
        // First whether bytes wait in the socket, then whether the thread took some out and
        // is still on them: in that order, no line can slip between the two looks.
        let flags = libc::MSG_PEEK | libc::MSG_DONTWAIT;
        match SockRef::from(socket.as_ref()?).recv_with_flags(&mut byte, flags) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            _ => return None,
        }
        if self.reading.load(Ordering::SeqCst) {
            return None;
        }
        self.state()
    }

    /// Forgets generation `id` (it ended).
    pub(super) fn unroute(&self, id: u64) {
        lock(&self.routes).remove(&id);
    }

    /// Ends the thread at its next event (the worker pings every second) or retry.
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Drops the open connection at its next line (the worker pings every second) and opens
    /// a new one after the retry wait: the health thread took the host for lost.
    pub(super) fn renew(&self) {
        self.renew.store(true, Ordering::SeqCst);
    }

    /// What the lost or dropped connection said: its hello's id and the worker's state.
    fn forget_connection(&self) {
        *lock(&self.socket) = None;
        *lock(&self.id) = None;
        *lock(&self.state) = None;
        self.reading.store(false, Ordering::SeqCst);
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn tell(&self, input: impl FnOnce(HostId) -> Input) {
        if let Some(f) = &self.feed {
            let f = lock(f);
            let _ = f.1.send(input(f.0));
        }
    }

    fn run(&self, socket: &std::path::Path, timeout: Duration, retry: Duration) {
        // Logged once per outage, not once per retry.
        let mut lost = false;
        while !self.stopped() {
            match worker::watch(socket, timeout) {
                Ok(mut w) => {
                    if lost {
                        eprintln!(
                            "loopd: llama-worker's watch ({}) is open again",
                            socket.display()
                        );
                    }
                    lost = false;
                    self.renew.store(false, Ordering::SeqCst);
                    *lock(&self.socket) = w.get_ref().try_clone().ok();
                    self.tell(Input::Connected);
                    while !self.stopped() {
                        if !w.has_buffered() {
                            // Waits for the next bytes without taking them (within the
                            // socket's read timeout; a failure is the read's to report).
                            let mut byte = [MaybeUninit::<u8>::uninit()];
                            let _ = SockRef::from(w.get_ref()).peek(&mut byte);
                        }
                        self.reading.store(true, Ordering::SeqCst);
                        let event = w.next_event();
                        // Set before the health thread hears the line, so a host its placement
                        // shows in a state has that state on its watch too.
                        if let Ok(WatchEvent::State { state, spawns }) = &event {
                            *lock(&self.state) = Some((*state, *spawns));
                        }
                        if let Ok(e) = &event {
                            let e = *e;
                            self.tell(|h| Input::Line(h, e));
                        }
                        match event {
                            Ok(WatchEvent::Failed { id, reason }) => {
                                if let Some(to) = lock(&self.routes).remove(&id) {
                                    let _ = to.send(Notice::Failed(id, reason));
                                }
                            }
                            Ok(WatchEvent::Hello { watch }) => *lock(&self.id) = Some(watch),
                            Ok(_) => {}
                            // A line this loopd does not know: the next one may be.
                            Err(WorkerError::BadAnswer(_)) => {}
                            Err(e) => {
                                self.forget_connection();
                                eprintln!(
                                    "loopd: llama-worker's watch ({}) was lost ({e})",
                                    socket.display()
                                );
                                self.tell(Input::Lost);
                                lost = true;
                                break;
                            }
                        }
                        if !w.has_buffered() {
                            self.reading.store(false, Ordering::SeqCst);
                        }
                        if self.renew.swap(false, Ordering::SeqCst) {
                            self.forget_connection();
                            eprintln!(
                                "loopd: llama-worker's watch ({}) dropped: its host was lost",
                                socket.display()
                            );
                            lost = true;
                            break;
                        }
                    }
                }
                Err(e) => {
                    if !lost {
                        eprintln!(
                            "loopd: llama-worker's watch ({}) could not be opened ({e})",
                            socket.display()
                        );
                    }
                    self.tell(Input::Lost);
                    lost = true;
                }
            }
            let mut left = retry;
            while !left.is_zero() && !self.stopped() {
                let step = left.min(Duration::from_millis(100));
                std::thread::sleep(step);
                left -= step;
            }
        }
    }
}
