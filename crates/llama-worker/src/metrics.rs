//! The worker's counters in the Prometheus text format (0.0.4, the form node_exporter's
//! textfile collector and Prometheus read with every type kept; written by the
//! `prometheus-client` crate, as loopd's): what the status socket's `metrics` command answers
//! and what `metrics_file` holds.
//!
//! [`Metrics`] is fed events with their time (`handle_*(now, ..)`) by the worker's shell and
//! reads no clock itself, so the text for a known sequence of events is exact on a fake clock.
//! Every label value is there from the start (at 0), so a series never appears out of nowhere.
//! The text always ends with `# EOF\n`: the socket's end-of-answer mark, a comment to a
//! Prometheus parser.

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::path::Path;
use std::time::Duration;

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::prometheus_text::encode;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

use crate::policy::{RestartCause, StallVerdict, State};

/// Every metric name starts so.
pub const PREFIX: &str = "llama_worker";

/// Upper bounds (seconds) of the spawn-to-ready histogram's buckets: a small model on a warm
/// cache is ready in about a second, a large one from a cold disk in minutes.
pub const READY_BUCKETS: [f64; 10] = [1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0];

const STATES: [State; 5] = [
    State::Stopped,
    State::Starting,
    State::Ready,
    State::Restarting,
    State::Failed,
];
const CAUSES: [RestartCause; 7] = RestartCause::ALL;
const VERDICTS: [&str; 3] = ["restarting", "not_stalled", "not_ready"];

/// One metric per value of one label, written in a fixed order (the crate's `Family` writes
/// them in hash order, which would make the text differ from run to run).
#[derive(Clone, Debug)]
struct Labelled<M> {
    key: &'static str,
    series: Vec<(&'static str, M)>,
}

impl<M: Clone + Default> Labelled<M> {
    fn new(key: &'static str, values: impl IntoIterator<Item = &'static str>) -> Self {
        let series = values.into_iter().map(|v| (v, M::default())).collect();
        Self { key, series }
    }

    /// The metric for `value`; `None` for a value not listed at construction.
    fn get(&self, value: &str) -> Option<&M> {
        self.series
            .iter()
            .find(|(v, _)| *v == value)
            .map(|(_, m)| m)
    }
}

impl<M: EncodeMetric + TypedMetric> EncodeMetric for Labelled<M> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        for (value, m) in &self.series {
            m.encode(encoder.encode_family(&[(self.key, *value)])?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        M::TYPE
    }
}

/// The counters, and what they need to remember between events.
pub struct Metrics {
    registry: Registry,
    state: Labelled<Gauge>,
    restarts: Labelled<Counter>,
    stall_verdicts: Labelled<Counter>,
    spawns: Counter,
    spawn_to_ready: Histogram,
    ready_seconds: Counter<f64, AtomicU64>,
    inflight: Gauge,
    current: State,
    /// When the current state began (or was last folded into `ready_seconds`).
    since: Duration,
    /// The latest spawn not yet followed by readiness.
    spawned_at: Option<Duration>,
    /// The policy's restart total as last seen.
    seen_restarts: u64,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics")
            .field("current", &self.current)
            .field("since", &self.since)
            .finish_non_exhaustive()
    }
}

impl Metrics {
    /// Fresh counters for a worker that is `stopped` at `now`.
    pub fn new(now: Duration) -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let state = Labelled::<Gauge>::new("state", STATES.map(State::as_str));
        let restarts = Labelled::<Counter>::new("cause", CAUSES.map(RestartCause::as_str));
        let stall_verdicts = Labelled::<Counter>::new("verdict", VERDICTS);
        let spawns = Counter::default();
        let spawn_to_ready = Histogram::new(READY_BUCKETS);
        let ready_seconds = Counter::<f64, AtomicU64>::default();
        let inflight = Gauge::default();
        registry.register(
            "state",
            "The worker's lifecycle state: 1 for the current one, 0 for the others",
            state.clone(),
        );
        registry.register(
            "restarts",
            "Restarts of the server, by what caused them",
            restarts.clone(),
        );
        registry.register(
            "stall_verdicts",
            "Stall reports, by the worker's verdict",
            stall_verdicts.clone(),
        );
        registry.register("spawns", "Server processes spawned", spawns.clone());
        registry.register(
            "spawn_to_ready_seconds",
            "Seconds from a spawn to the server's first good readiness answer, per spawn",
            spawn_to_ready.clone(),
        );
        registry.register(
            "ready_seconds",
            "Seconds spent in the ready state, in total",
            ready_seconds.clone(),
        );
        registry.register(
            "inflight_requests",
            "Requests admitted and not yet finished",
            inflight.clone(),
        );
        if let Some(g) = state.get(State::Stopped.as_str()) {
            g.set(1);
        }
        Self {
            registry,
            state,
            restarts,
            stall_verdicts,
            spawns,
            spawn_to_ready,
            ready_seconds,
            inflight,
            current: State::Stopped,
            since: now,
            spawned_at: None,
            seen_restarts: 0,
        }
    }

    /// A server process was spawned at `now`.
    pub fn handle_spawned(&mut self, now: Duration) {
        self.spawns.inc();
        self.spawned_at = Some(now);
    }

    /// The policy as seen at `now`: its state, its restart total and the latest cause. Restarts
    /// since the last call are counted under `last_cause`; entering `ready` records the time
    /// since the spawn.
    pub fn handle_policy(
        &mut self,
        now: Duration,
        state: State,
        total_restarts: u64,
        last_cause: Option<RestartCause>,
    ) {
        if total_restarts > self.seen_restarts {
            if let Some(cause) = last_cause {
                if let Some(c) = self.restarts.get(cause.as_str()) {
                    c.inc_by(total_restarts - self.seen_restarts);
                }
            }
            self.seen_restarts = total_restarts;
        }
        if state == self.current {
            return;
        }
        self.fold_ready(now);
        for (name, g) in &self.state.series {
            g.set(i64::from(*name == state.as_str()));
        }
        if state == State::Ready {
            if let Some(at) = self.spawned_at.take() {
                self.spawn_to_ready
                    .observe(now.saturating_sub(at).as_secs_f64());
            }
        }
        self.current = state;
        self.since = now;
    }

    /// A stall report got `verdict`.
    pub fn handle_stall(&mut self, verdict: StallVerdict) {
        let name = match verdict {
            StallVerdict::Restarting => "restarting",
            StallVerdict::NotStalled { .. } => "not_stalled",
            StallVerdict::NotReady => "not_ready",
        };
        if let Some(c) = self.stall_verdicts.get(name) {
            c.inc();
        }
    }

    /// The text at `now`, with `inflight` requests registered. Ends with `# EOF\n`.
    pub fn encode(&mut self, now: Duration, inflight: usize) -> String {
        self.fold_ready(now);
        self.inflight
            .set(i64::try_from(inflight).unwrap_or(i64::MAX));
        let mut out = String::new();
        // Writing into a String cannot fail, and every metric here encodes.
        let _ = encode(&mut out, &self.registry);
        out.push_str("# EOF\n");
        out
    }

    /// Adds the time in `ready` up to `now` to the total.
    fn fold_ready(&mut self, now: Duration) {
        if self.current == State::Ready && now > self.since {
            self.ready_seconds
                .inc_by(now.saturating_sub(self.since).as_secs_f64());
            self.since = now;
        }
    }
}

/// Replaces `path` with `text` so that a reader sees the old file or the new one, never a part:
/// written to `.<name>.tmp` in the same folder (a name node_exporter's textfile collector
/// skips, as it reads only `*.prom`), flushed, then renamed over `path`.
pub fn write_atomically(path: &Path, text: &str) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    let written = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    const EXPECTED: &str = r#"# HELP llama_worker_state The worker's lifecycle state: 1 for the current one, 0 for the others.
# TYPE llama_worker_state gauge
llama_worker_state{state="stopped"} 0
llama_worker_state{state="starting"} 0
llama_worker_state{state="ready"} 0
llama_worker_state{state="restarting"} 1
llama_worker_state{state="failed"} 0
# HELP llama_worker_restarts_total Restarts of the server, by what caused them.
# TYPE llama_worker_restarts_total counter
llama_worker_restarts_total{cause="exited"} 1
llama_worker_restarts_total{cause="startup_timeout"} 0
llama_worker_restarts_total{cause="unready"} 0
llama_worker_restarts_total{cause="stall"} 1
llama_worker_restarts_total{cause="model_exited"} 0
llama_worker_restarts_total{cause="rpc_exited"} 0
llama_worker_restarts_total{cause="rpc_startup_timeout"} 0
# HELP llama_worker_stall_verdicts_total Stall reports, by the worker's verdict.
# TYPE llama_worker_stall_verdicts_total counter
llama_worker_stall_verdicts_total{verdict="restarting"} 1
llama_worker_stall_verdicts_total{verdict="not_stalled"} 1
llama_worker_stall_verdicts_total{verdict="not_ready"} 0
# HELP llama_worker_spawns_total Server processes spawned.
# TYPE llama_worker_spawns_total counter
llama_worker_spawns_total 2
# HELP llama_worker_spawn_to_ready_seconds Seconds from a spawn to the server's first good readiness answer, per spawn.
# TYPE llama_worker_spawn_to_ready_seconds histogram
llama_worker_spawn_to_ready_seconds_bucket{le="1"} 0
llama_worker_spawn_to_ready_seconds_bucket{le="2"} 1
llama_worker_spawn_to_ready_seconds_bucket{le="5"} 2
llama_worker_spawn_to_ready_seconds_bucket{le="10"} 2
llama_worker_spawn_to_ready_seconds_bucket{le="20"} 2
llama_worker_spawn_to_ready_seconds_bucket{le="30"} 2
llama_worker_spawn_to_ready_seconds_bucket{le="60"} 2
llama_worker_spawn_to_ready_seconds_bucket{le="120"} 2
llama_worker_spawn_to_ready_seconds_bucket{le="300"} 2
llama_worker_spawn_to_ready_seconds_bucket{le="600"} 2
llama_worker_spawn_to_ready_seconds_bucket{le="+Inf"} 2
llama_worker_spawn_to_ready_seconds_sum 5.5
llama_worker_spawn_to_ready_seconds_count 2
# HELP llama_worker_ready_seconds_total Seconds spent in the ready state, in total.
# TYPE llama_worker_ready_seconds_total counter
llama_worker_ready_seconds_total 11.5
# HELP llama_worker_inflight_requests Requests admitted and not yet finished.
# TYPE llama_worker_inflight_requests gauge
llama_worker_inflight_requests 2
# EOF
"#;

    /// Spawned at 1 s, ready at 4.5 s; a stall report not stalled; the server exits at 10 s
    /// (restarting), is spawned again at 12 s, ready at 14 s; a stall restarts at 20 s; read at
    /// 21 s with 2 requests in flight.
    #[test]
    fn the_text_for_a_known_sequence() {
        let ms = Duration::from_millis;
        let mut m = Metrics::new(s(0));
        m.handle_policy(s(1), State::Starting, 0, None);
        m.handle_spawned(s(1));
        m.handle_policy(ms(4_500), State::Ready, 0, None);
        m.handle_stall(StallVerdict::NotStalled {
            since_progress: s(1),
        });
        m.handle_policy(s(10), State::Restarting, 1, Some(RestartCause::Exited));
        m.handle_spawned(s(12));
        m.handle_policy(s(14), State::Ready, 1, Some(RestartCause::Exited));
        m.handle_stall(StallVerdict::Restarting);
        m.handle_policy(s(20), State::Restarting, 2, Some(RestartCause::Stall));
        assert_eq!(m.encode(s(21), 2), EXPECTED);
    }

    #[test]
    fn a_fresh_worker() {
        let mut m = Metrics::new(s(0));
        let text = m.encode(s(5), 0);
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(
            text.contains("llama_worker_state{state=\"stopped\"} 1\n"),
            "{text}"
        );
    }
}
