//! What the health thread hears, on one queue: each host's watch (`watch.rs`) and the
//! runner's requests (`mod.rs`) feed it; the thread (`hosts.rs`) drains it.

use super::worker::WatchEvent;
use crate::fleet::{HostId, RequestId};

/// What the health thread hears.
#[derive(Debug)]
pub(super) enum Input {
    /// A watch to the host opened.
    Connected(HostId),
    /// A line of the host's open watch.
    Line(HostId, WatchEvent),
    /// The host's watch ended, failed or could not be opened.
    Lost(HostId),
    /// A request now runs on the host.
    Placed(RequestId, HostId),
    /// A request's generation went out: it may be rehomed once more.
    Sent(RequestId),
    /// A request's connect to its host's inference socket was refused (nothing was sent):
    /// it is answered on its ends channel, `Rehomed` or `HostLost`.
    ConnectRefused(RequestId),
    /// A request ended.
    Ended(RequestId),
    /// The runner is being dropped.
    Stop,
}
