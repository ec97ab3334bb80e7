//! The `[runner]` section of loopd's `config.toml`: the tool budget, the tool timeout, the worker's
//! status socket, the stall limit, the grace for a broken-off generation and the loop
//! detector's thresholds.

use std::path::PathBuf;

use serde::Deserialize;

/// `[runner]`: how the request runner runs agent requests.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunnerConfig {
    /// Tool iterations a request may use unless it asks for another budget (8).
    pub budget: u32,
    /// Slots in the runner's table; 0 takes the server's `total_slots` from `/props` (0).
    pub slots: u32,
    /// How long one tool call may run before it fails the request (10 s).
    pub tool_timeout_ms: u64,
    /// llama-worker's status socket; without it the runner admits on its slot table alone
    /// and reports no stalls.
    pub worker_socket: Option<PathBuf>,
    /// How often the worker's status is read while requests run, and how often stalls are
    /// checked (1 s).
    pub worker_poll_ms: u64,
    /// How long one status or stall call to the worker may take (2 s).
    pub worker_timeout_ms: u64,
    /// A generating request with no stream progress for this long reports a stall to the
    /// worker, and again after each further such period. Left out of the file it is
    /// `limits.liveness_ms` (30 s by default); a value written there must not exceed it.
    pub stall_ms: u64,
    /// A registered generation whose stream broke off (closed early, cut mid-event) is the
    /// worker's to explain for this long: a `server_died` it pushes meanwhile is the reason,
    /// else the client's error stands (10 s, two of llama-worker's default readiness probes,
    /// which is when it sees a model instance die; 0: at once).
    pub death_grace_ms: u64,
    /// The loop detector's thresholds.
    pub loop_detector: LoopThresholds,
    /// `loopd serve`: how long an unfetched result is kept (3,600 s); then `NOT_FOUND`.
    pub result_ttl_s: u64,
    /// `loopd serve`: results kept at most (1,024); past it the oldest is dropped.
    pub max_results: usize,
    /// `[runner.kv]`: each session's KV saved to a file and restored.
    pub kv: super::KvSettings,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            budget: 8,
            slots: 0,
            tool_timeout_ms: 10_000,
            worker_socket: None,
            worker_poll_ms: 1_000,
            worker_timeout_ms: 2_000,
            // What a config file that leaves it out gets with the default limits.
            stall_ms: loopd_client::config::Limits::default().liveness_ms,
            death_grace_ms: 10_000,
            loop_detector: LoopThresholds::default(),
            result_ttl_s: 3_600,
            max_results: 1_024,
            kv: super::KvSettings::default(),
        }
    }
}

/// `[runner.loop_detector]`: repeated lines fire after more repeats when they are short; the
/// detector's own configuration, whose defaults are 16 / 64 bytes and 24 / 8 / 5 repeats.
pub type LoopThresholds = llama_proto::LoopConfig;

impl RunnerConfig {
    /// `(table, key, message)` of the first value the types cannot refuse.
    pub fn validate(&self) -> Result<(), (&'static str, &'static str, &'static str)> {
        let ms = [
            ("tool_timeout_ms", self.tool_timeout_ms),
            ("worker_poll_ms", self.worker_poll_ms),
            ("worker_timeout_ms", self.worker_timeout_ms),
            ("stall_ms", self.stall_ms),
            ("result_ttl_s", self.result_ttl_s),
            ("max_results", self.max_results as u64),
        ];
        if let Some((key, _)) = ms.iter().find(|(_, v)| *v == 0) {
            let unit = match *key {
                "result_ttl_s" => "must be at least 1 s",
                "max_results" => "must be at least 1",
                _ => "must be at least 1 ms",
            };
            return Err(("runner", key, unit));
        }
        if self.kv.max_bytes == 0 {
            return Err(("runner.kv", "max_bytes", "must be at least 1"));
        }
        let table = "runner.loop_detector";
        match self.loop_detector.check() {
            Ok(()) => Ok(()),
            Err(llama_proto::LoopConfigError::TooFewRepeats { field, .. }) => {
                let key = match field {
                    "short_repeats" => "short_repeats",
                    "medium_repeats" => "medium_repeats",
                    _ => "long_repeats",
                };
                Err((table, key, "must be at least 2"))
            }
            Err(_) => Err((table, "medium_from", "must not be greater than long_from")),
        }
    }
}
