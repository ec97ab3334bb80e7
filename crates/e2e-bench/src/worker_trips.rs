//! The llama-worker round trips `loopd serve`'s runner makes on a request's own thread, timed
//! from here with the same client (`worker-proto`): `status`, `register <slot>` (before the
//! POST), `progress <id> first_byte` (on the response's head) and `done <id>` (before the
//! result goes to the client). Not a part of any path's figure: what they cost on their own,
//! with the model idle and while it generates.

use std::path::Path;
use std::time::{Duration, Instant};

use worker_proto::{ProgressKind, RegisterAnswer};

/// How long one round trip may take before the bench gives up on it.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The times of each kind of round trip, in ms.
#[derive(Debug, Default)]
pub struct Trips {
    /// `status`.
    pub status: Vec<f64>,
    /// `register <slot>`.
    pub register: Vec<f64>,
    /// `progress <id> first_byte`.
    pub progress: Vec<f64>,
    /// `done <id>`.
    pub done: Vec<f64>,
}

impl Trips {
    /// One request's four round trips, for `slot`, in the runner's order; panics when the
    /// worker does not answer or refuses (the stack is the bench's own, and ready).
    pub fn measure(&mut self, socket: &Path, slot: u32) {
        let timed = |v: &mut Vec<f64>, t: Instant| v.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        worker_proto::status(socket, TIMEOUT).expect("llama-worker status");
        timed(&mut self.status, t);
        let t = Instant::now();
        let answer =
            worker_proto::register(socket, slot, None, TIMEOUT).expect("llama-worker register");
        timed(&mut self.register, t);
        let RegisterAnswer::Registered(id) = answer else {
            panic!("llama-worker refused register {slot}: {answer:?}");
        };
        let t = Instant::now();
        worker_proto::progress(socket, id, ProgressKind::FirstByte, TIMEOUT)
            .expect("llama-worker progress");
        timed(&mut self.progress, t);
        let t = Instant::now();
        worker_proto::done(socket, id, TIMEOUT).expect("llama-worker done");
        timed(&mut self.done, t);
    }

    /// The four before the POST and after the answer that a request waits on: `status`,
    /// `register` and `done`, summed per set.
    pub fn on_the_path(&self) -> Vec<f64> {
        self.status
            .iter()
            .zip(&self.register)
            .zip(&self.done)
            .map(|((s, r), d)| s + r + d)
            .collect()
    }
}
