//! The snapshot a person and the rest of the system read: [`Status`], and its one-line JSON.
//!
//! The JSON is serialized with serde from a borrowed wire struct, so the names on the wire are
//! the `as_str` names of the enums and durations are seconds with millisecond precision.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::models::ModelState;
use crate::policy::{GenerationView, RestartCause, State};
use crate::probe::ProbeOutcome;
use crate::rpc::EndpointStatus;

/// One readiness probe's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadinessRecord {
    /// When (worker clock).
    pub at: Duration,
    /// The path whose answer this is (the first that failed, or the last).
    pub path: String,
    /// The answer.
    pub outcome: ProbeOutcome,
    /// Router mode: the first required model that was not loaded, and what the router said of
    /// it (none when every one was loaded, or the model list was not read).
    pub model: Option<(String, ModelState)>,
}

/// A model instance's exit, as the router reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelExit {
    /// When the worker read it (worker clock).
    pub at: Duration,
    /// The model's id.
    pub model: String,
    /// The instance's exit status.
    pub exit_code: i64,
    /// Whether the worker was not yet ready (the model failed to load) rather than serving.
    pub while_loading: bool,
}

/// A registered generation in the snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GenerationStatus {
    /// Its id, slot, phase and last progress.
    pub view: GenerationView,
    /// Time since that progress.
    pub progress_age: Duration,
}

/// A snapshot of the worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// Lifecycle state.
    pub state: State,
    /// The server's pid while one runs.
    pub pid: Option<u32>,
    /// Its process group's id (the guard's pid, see [`crate::process`]) while one runs.
    pub pgid: Option<i32>,
    /// The server's port.
    pub port: u16,
    /// Restarts in a row (see [`crate::policy`]): one more than `max_restarts_per_window` fails.
    pub consecutive_restarts: u32,
    /// Restarts since the worker began.
    pub total_restarts: u64,
    /// Processes spawned since the worker began.
    pub spawns: u64,
    /// What caused the latest restart or failure.
    pub last_cause: Option<RestartCause>,
    /// The latest CPU-time sample over the group, in clock ticks.
    pub cpu_ticks: Option<u64>,
    /// Time since the group's CPU time last rose.
    pub cpu_progress_age: Option<Duration>,
    /// The latest readiness answer.
    pub last_readiness: Option<ReadinessRecord>,
    /// Time since that answer.
    pub readiness_age: Option<Duration>,
    /// Registered in-flight requests (in-process ones and registered generations).
    pub inflight: usize,
    /// The registered generations, by id.
    pub generations: Vec<GenerationStatus>,
    /// The latest model instance exit the router reported.
    pub last_model_exit: Option<ModelExit>,
    /// Time since that exit was read.
    pub model_exit_age: Option<Duration>,
    /// Where the server's output goes (`None`: the worker's own stderr).
    pub log_file: Option<PathBuf>,
    /// While `failed`: why, in one sentence (the cause, the model and exit status, the log).
    /// While waiting for an RPC endpoint that does not accept connections: which one, and what
    /// the connect got.
    pub reason: Option<String>,
    /// The RPC endpoints of the unit with their latest connect probe (empty without `[rpc]`).
    pub rpc: Vec<EndpointStatus>,
    /// The latest loss of an RPC endpoint: a local server that exited, or a remote one found
    /// down after the server exited.
    pub rpc_lost: Option<RpcLoss>,
}

/// An RPC endpoint the unit lost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RpcLoss {
    /// When the worker saw it (worker clock).
    pub at: Duration,
    /// `127.0.0.1:40001 (local)`.
    pub endpoint: String,
    /// How: the local server's exit status, or the connect probe's error.
    pub what: String,
    /// Time since (filled in by the status snapshot).
    pub age: Option<Duration>,
}

pub use worker_proto::secs;

/// The JSON shape of [`Status`], field order as written.
#[derive(Serialize)]
struct StatusJson<'a> {
    state: &'static str,
    pid: Option<u32>,
    pgid: Option<i32>,
    port: u16,
    consecutive_restarts: u32,
    total_restarts: u64,
    spawns: u64,
    last_cause: Option<&'static str>,
    cpu_ticks: Option<u64>,
    cpu_progress_age_s: Option<f64>,
    last_readiness: Option<ReadinessJson<'a>>,
    inflight: usize,
    last_model_exit: Option<ModelExitJson<'a>>,
    log_file: Option<std::borrow::Cow<'a, str>>,
    reason: Option<&'a str>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    rpc: Vec<EndpointJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rpc_lost: Option<RpcLossJson<'a>>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    generations: Vec<GenerationJson>,
}

#[derive(Serialize)]
struct GenerationJson {
    id: u64,
    slot: u32,
    phase: &'static str,
    progress_age_s: f64,
}

#[derive(Serialize)]
struct EndpointJson {
    endpoint: String,
    place: &'static str,
    pid: Option<u32>,
    pgid: Option<i32>,
    /// The latest connect: `true` accepted, `false` not, `null` not probed since the start.
    up: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    answer: Option<&'static str>,
}

#[derive(Serialize)]
struct RpcLossJson<'a> {
    endpoint: &'a str,
    what: &'a str,
    age_s: Option<f64>,
}

#[derive(Serialize)]
struct ModelExitJson<'a> {
    model: &'a str,
    exit_code: i64,
    while_loading: bool,
    age_s: Option<f64>,
}

#[derive(Serialize)]
struct ModelJson<'a> {
    id: &'a str,
    status: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_code: Option<i64>,
}

#[derive(Serialize)]
struct ReadinessJson<'a> {
    ok: bool,
    path: &'a str,
    answer: Answer,
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<ModelJson<'a>>,
    age_s: Option<f64>,
}

/// The HTTP status code, or the name of the probe error.
#[derive(Serialize)]
#[serde(untagged)]
enum Answer {
    Code(u16),
    Error(&'static str),
}

impl Status {
    /// One line of JSON, keys in a fixed order.
    pub fn to_json(&self) -> String {
        let last_readiness = self.last_readiness.as_ref().map(|r| {
            let (ok, answer) = match r.outcome {
                ProbeOutcome::Status(c) => (c == 200 && r.model.is_none(), Answer::Code(c)),
                ProbeOutcome::Error(e) => (false, Answer::Error(e.as_str())),
            };
            ReadinessJson {
                ok,
                path: &r.path,
                answer,
                model: r.model.as_ref().map(|(id, st)| ModelJson {
                    id,
                    status: st.as_str(),
                    exit_code: match st {
                        ModelState::Failed { exit_code } => Some(*exit_code),
                        _ => None,
                    },
                }),
                age_s: self.readiness_age.map(secs),
            }
        });
        let json = StatusJson {
            state: self.state.as_str(),
            pid: self.pid,
            pgid: self.pgid,
            port: self.port,
            consecutive_restarts: self.consecutive_restarts,
            total_restarts: self.total_restarts,
            spawns: self.spawns,
            last_cause: self.last_cause.map(RestartCause::as_str),
            cpu_ticks: self.cpu_ticks,
            cpu_progress_age_s: self.cpu_progress_age.map(secs),
            last_readiness,
            inflight: self.inflight,
            last_model_exit: self.last_model_exit.as_ref().map(|e| ModelExitJson {
                model: &e.model,
                exit_code: e.exit_code,
                while_loading: e.while_loading,
                age_s: self.model_exit_age.map(secs),
            }),
            log_file: self.log_file.as_ref().map(|p| p.to_string_lossy()),
            reason: self.reason.as_deref(),
            rpc: self
                .rpc
                .iter()
                .map(|e| EndpointJson {
                    endpoint: e.addr.to_string(),
                    place: e.place.as_str(),
                    pid: e.pid,
                    pgid: e.pgid,
                    up: e.last_probe.map(|r| r.is_ok()),
                    answer: e.last_probe.and_then(|r| r.err()).map(|e| e.as_str()),
                })
                .collect(),
            rpc_lost: self.rpc_lost.as_ref().map(|l| RpcLossJson {
                endpoint: &l.endpoint,
                what: &l.what,
                age_s: l.age.map(secs),
            }),
            generations: self
                .generations
                .iter()
                .map(|g| GenerationJson {
                    id: g.view.id,
                    slot: g.view.slot,
                    phase: g.view.phase.as_str(),
                    progress_age_s: secs(g.progress_age),
                })
                .collect(),
        };
        // Plain structs of numbers, strings and options: serializing cannot fail.
        serde_json::to_string(&json).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::ProbeError;

    #[test]
    fn json_of_a_fresh_and_a_busy_status() {
        let mut s = Status {
            state: State::Stopped,
            pid: None,
            pgid: None,
            port: 8080,
            consecutive_restarts: 0,
            total_restarts: 0,
            spawns: 0,
            last_cause: None,
            cpu_ticks: None,
            cpu_progress_age: None,
            last_readiness: None,
            readiness_age: None,
            inflight: 0,
            generations: Vec::new(),
            last_model_exit: None,
            model_exit_age: None,
            log_file: None,
            reason: None,
            rpc: Vec::new(),
            rpc_lost: None,
        };
        assert_eq!(
            s.to_json(),
            "{\"state\":\"stopped\",\"pid\":null,\"pgid\":null,\"port\":8080,\"consecutive_restarts\":0,\
             \"total_restarts\":0,\"spawns\":0,\"last_cause\":null,\"cpu_ticks\":null,\
             \"cpu_progress_age_s\":null,\"last_readiness\":null,\"inflight\":0,\
             \"last_model_exit\":null,\"log_file\":null,\"reason\":null}"
        );
        s.state = State::Restarting;
        s.pid = Some(42);
        s.pgid = Some(41);
        s.consecutive_restarts = 2;
        s.last_cause = Some(RestartCause::Unready);
        s.cpu_ticks = Some(1234);
        s.cpu_progress_age = Some(Duration::from_millis(1500));
        s.last_readiness = Some(ReadinessRecord {
            at: Duration::ZERO,
            path: "/v1/\"models\"\n".into(),
            outcome: ProbeOutcome::Error(ProbeError::Timeout),
            model: None,
        });
        s.readiness_age = Some(Duration::from_micros(250_999));
        assert_eq!(
            s.to_json(),
            "{\"state\":\"restarting\",\"pid\":42,\"pgid\":41,\"port\":8080,\"consecutive_restarts\":2,\
             \"total_restarts\":0,\"spawns\":0,\"last_cause\":\"unready\",\"cpu_ticks\":1234,\
             \"cpu_progress_age_s\":1.5,\"last_readiness\":{\"ok\":false,\
             \"path\":\"/v1/\\\"models\\\"\\n\",\"answer\":\"timeout\",\"age_s\":0.25},\"inflight\":0,\
             \"last_model_exit\":null,\"log_file\":null,\"reason\":null}"
        );
        s.last_readiness.as_mut().unwrap().outcome = ProbeOutcome::Status(200);
        assert!(s
            .to_json()
            .contains("{\"ok\":true,\"path\":\"/v1/\\\"models\\\"\\n\",\"answer\":200,"));
    }

    #[test]
    fn the_json_parses_back_with_the_same_values() {
        let s = Status {
            state: State::Ready,
            pid: Some(7),
            pgid: Some(6),
            port: 1,
            consecutive_restarts: 1,
            total_restarts: u64::MAX,
            spawns: 3,
            last_cause: Some(RestartCause::StartupTimeout),
            cpu_ticks: Some(0),
            cpu_progress_age: Some(Duration::from_secs(604_800)),
            last_readiness: None,
            readiness_age: None,
            inflight: 2,
            generations: vec![GenerationStatus {
                view: GenerationView {
                    id: 7,
                    slot: 1,
                    phase: crate::policy::GenerationPhase::Streaming,
                    last_progress_at: Duration::ZERO,
                },
                progress_age: Duration::from_millis(1250),
            }],
            last_model_exit: None,
            model_exit_age: None,
            log_file: None,
            reason: None,
            rpc: Vec::new(),
            rpc_lost: None,
        };
        let v: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap();
        assert_eq!(v["total_restarts"], u64::MAX);
        assert_eq!(v["last_cause"], "startup_timeout");
        assert_eq!(v["cpu_progress_age_s"], 604_800.0);
        assert!(s.to_json().ends_with(
            ",\"generations\":[{\"id\":7,\"slot\":1,\"phase\":\"streaming\",\
             \"progress_age_s\":1.25}]}"
        ));
    }
}
