//! Several inference hosts behind one daemon (design A of `research/fleet.md`): the `[[host]]` config table ([`host`]), where a new request runs
//! ([`placement`], with its session map in `session.rs`) and what each host's `watch` means
//! for the requests running there ([`health`]). The daemon feeds health's host states to
//! placement; neither machine knows the other.
//!
//! Everything here is sans-IO: time is an input (`now`, a [`Duration`](std::time::Duration)
//! since any fixed origin), nothing reads a clock or opens a socket, and a daemon drives the
//! machines with `handle_*` and reads their decisions. The runner drives them
//! (`runner/hosts.rs`: a client and a `watch` thread per host, and the health thread).

pub mod health;
pub mod host;
pub mod placement;
mod request;
mod session;

pub use health::{EndReason, Health, HealthEvent, WATCH_SILENCE};
pub use host::{Fleet, FleetError, HostConfig, HostId, HostSlot, HostState, MAX_HOST_NAME_BYTES};
pub use placement::{Placed, PlacedBy, Placement, PlacementConfig, PlacementPolicy};
pub use request::{RequestId, SubmitError};
pub use session::{SessionKey, SESSION_CAPACITY, SESSION_TTL};
