//! The accept loop: admit or refuse each connection, then hand it to [`crate::forward`].
//!
//! Promise: a refused connection is closed before its log line is written, and nothing about
//! any connection's content is ever printed.

use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::admission::Admission;
use crate::forward::{self, OpenCount};

/// Pause after a failed `accept` (e.g. out of descriptors) so the loop does not spin.
pub const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Accepts forever on `listener`, forwarding admitted connections to `upstream`.
pub fn accept_loop(listener: &UnixListener, upstream: &str) -> ! {
    let upstream: Arc<str> = Arc::from(upstream);
    let open = OpenCount::default();
    let mut admission = Admission::new(Instant::now());
    loop {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(e) => {
                eprintln!("inferproxy: accept failed: {e}");
                thread::sleep(ACCEPT_ERROR_PAUSE);
                continue;
            }
        };
        if let Err(refusal) = admission.admit(Instant::now(), open.get()) {
            drop(client);
            eprintln!("inferproxy: refused a connection: {refusal}");
            continue;
        }
        if let Err(e) = forward::spawn(client, upstream.clone(), open.enter()) {
            eprintln!("inferproxy: refused a connection: cannot start a thread: {e}");
        }
    }
}
