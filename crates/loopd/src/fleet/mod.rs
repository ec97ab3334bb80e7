//! Several inference hosts behind one daemon (issue 33, design A of
//! `research/fleet.md`): the `[[host]]` config table ([`host`]).
//!
//! Everything here is sans-IO. Not wired into the daemon yet.

pub mod host;

pub use host::{Fleet, FleetError, HostConfig, HostId, MAX_HOST_NAME_BYTES};
