//! The fake llama-server (`llama_harness::fake`), and the slot these tests hold on a client's gate.
#![allow(dead_code)]

use std::time::Duration;

pub use llama_harness::fake::*;

/// Takes `slot` of `client`'s gate at once, as another request in flight would, until the
/// returned permit is dropped.
pub fn hold_slot(
    client: &loopd_client::llama::Client,
    slot: u32,
) -> loopd_client::llama::SlotPermit<'_> {
    client
        .gate()
        .acquire(
            slot,
            Duration::MAX,
            Duration::from_millis(10),
            &loopd_client::llama::Cancel::new(),
            client.clock(),
            &mut |_| {},
        )
        .expect("a free slot")
}
