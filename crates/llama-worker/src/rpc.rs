//! llama.cpp's RPC backend as one unit with the server: the `[rpc]` config section, its
//! endpoints, and the connect probe that says whether each accepts a connection.
//!
//! A model too big for one machine is split by `llama-server --rpc host:port,...` over
//! `ggml-rpc-server` processes. Local ones the worker starts itself, each in a process group of
//! its own led by a guard ([`crate::process`]); remote ones (on other hosts) it only checks.
//! Before it spawns the server it waits until every endpoint accepts a TCP connection; it then
//! appends `--rpc <every endpoint>` and `--cache-ram 0` (saving the prompt cache with RPC
//! devices crashes the server, llama.cpp issue #26529) to the server's arguments.
//!
//! The probe only connects and closes: `ggml-rpc-server` serves one client at a time with a
//! listen backlog of 1, so it is never probed while the server holds it (only before a spawn),
//! or queued probes would fill its backlog and later connects would time out.

use core::fmt;
use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::config::{CommandSpec, ConfigError};
use crate::probe::{ProbeError, CANCEL_CHECK};

/// The placeholder in a local RPC server's `args` and `env` values replaced by its port.
pub const RPC_PORT_PLACEHOLDER: &str = "{rpc_port}";

/// Most endpoints in one unit (llama.cpp has no hard limit; more is surely a mistake).
pub const MAX_ENDPOINTS: usize = 16;

/// Server arguments the worker adds itself, refused in `args` when `[rpc]` is set.
pub const WORKER_ARGS: [&str; 2] = ["--rpc", "--cache-ram"];

/// The `[rpc]` section: the RPC servers the model is split over.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RpcConfig {
    /// `ggml-rpc-server`s the worker starts and owns (`[[rpc.local]]`), on 127.0.0.1.
    pub local: Vec<LocalRpc>,
    /// `ggml-rpc-server`s on other hosts, `"ip:port"`; the worker only checks that they accept
    /// connections.
    pub remote: Vec<String>,
}

/// One `[[rpc.local]]` entry.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LocalRpc {
    /// The `ggml-rpc-server` executable (path or name on `PATH`).
    pub command: String,
    /// Its arguments; [`RPC_PORT_PLACEHOLDER`] becomes its port.
    pub args: Vec<String>,
    /// Extra environment; `{rpc_port}` is replaced in values.
    pub env: BTreeMap<String, String>,
    /// A fixed port; unset: a free port chosen at each start of the unit.
    pub port: Option<u16>,
}

/// Where an endpoint runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Started by the worker: `[[rpc.local]]` entry number `.0` (from 0).
    Local(usize),
    /// On another host, only checked.
    Remote,
}

impl Place {
    /// `local` or `remote`, as in the status JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Local(_) => "local",
            Self::Remote => "remote",
        }
    }
}

/// The host local RPC servers listen on and the server connects to.
pub const LOCAL_HOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

impl RpcConfig {
    /// Checks the section: at least one endpoint, at most [`MAX_ENDPOINTS`], every local entry
    /// with a command, every remote an `ip:port`, no port or endpoint twice.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let n = self.local.len() + self.remote.len();
        if n == 0 {
            return Err(ConfigError::RpcNoEndpoints);
        }
        if n > MAX_ENDPOINTS {
            return Err(ConfigError::RpcTooManyEndpoints(n));
        }
        let mut seen: Vec<SocketAddr> = Vec::new();
        for (i, l) in self.local.iter().enumerate() {
            if l.command.trim().is_empty() {
                return Err(ConfigError::RpcNoCommand(i + 1));
            }
            match l.port {
                Some(0) => return Err(ConfigError::Zero("rpc.local.port")),
                Some(p) => {
                    let a = SocketAddr::new(LOCAL_HOST, p);
                    if seen.contains(&a) {
                        return Err(ConfigError::RpcDuplicatePort(p));
                    }
                    seen.push(a);
                }
                None => {}
            }
        }
        for r in &self.remote {
            let a = parse_endpoint(r).ok_or_else(|| ConfigError::RpcBadEndpoint(r.clone()))?;
            if seen.contains(&a) {
                return Err(ConfigError::RpcDuplicatePort(a.port()));
            }
            seen.push(a);
        }
        Ok(())
    }

    /// The command line of local entry `i` on `port`.
    pub fn local_spec(&self, i: usize, port: u16, log_file: Option<PathBuf>) -> CommandSpec {
        let l = &self.local[i];
        let p = port.to_string();
        CommandSpec {
            program: l.command.clone(),
            args: l
                .args
                .iter()
                .map(|a| a.replace(RPC_PORT_PLACEHOLDER, &p))
                .collect(),
            env: l
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.replace(RPC_PORT_PLACEHOLDER, &p)))
                .collect(),
            log_file,
        }
    }

    /// The remote endpoints, parsed (valid after [`RpcConfig::validate`]).
    pub fn remote_addrs(&self) -> Vec<SocketAddr> {
        self.remote
            .iter()
            .filter_map(|r| parse_endpoint(r))
            .collect()
    }
}

/// `ip:port` (`[v6]:port` for IPv6) with a port above 0. A host name is refused: resolving it
/// would be a blocking call without a deadline, and the RPC network is a private one.
pub fn parse_endpoint(s: &str) -> Option<SocketAddr> {
    s.parse::<SocketAddr>().ok().filter(|a| a.port() != 0)
}

/// The value of the server's `--rpc`: every endpoint, comma-separated, in config order (local
/// ones first).
pub fn rpc_arg(endpoints: &[SocketAddr]) -> String {
    endpoints
        .iter()
        .map(SocketAddr::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// One endpoint's latest probe, as the status shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointStatus {
    /// `ip:port`.
    pub addr: SocketAddr,
    /// Local (with its pid while it runs) or remote.
    pub place: Place,
    /// The local server's pid while it runs.
    pub pid: Option<u32>,
    /// Its process group (its guard's pid) while it runs.
    pub pgid: Option<i32>,
    /// The latest connect probe: `None` before the first, `Some(Ok)` accepted.
    pub last_probe: Option<Result<(), ProbeError>>,
}

/// Opens a TCP connection to `addr` and closes it, within `timeout`; gives up with
/// [`ProbeError::Cancelled`] within [`CANCEL_CHECK`] of `cancelled()` turning true.
pub fn connect(
    addr: SocketAddr,
    timeout: Duration,
    cancelled: &dyn Fn() -> bool,
) -> Result<(), ProbeError> {
    let deadline = Instant::now() + timeout;
    loop {
        if cancelled() {
            return Err(ProbeError::Cancelled);
        }
        let left = deadline
            .checked_duration_since(Instant::now())
            .filter(|l| !l.is_zero())
            .ok_or(ProbeError::Timeout)?;
        match TcpStream::connect_timeout(&addr, left.min(CANCEL_CHECK)) {
            Ok(_) => return Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
                ) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                return Err(ProbeError::Refused)
            }
            Err(e) => return Err(ProbeError::Io(e.kind())),
        }
    }
}

/// `127.0.0.1:50052 (local)`.
impl fmt::Display for EndpointStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.addr, self.place.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;
    use std::net::TcpListener;

    fn cfg(rpc: &str) -> Result<Config, ConfigError> {
        Config::from_toml(&format!("command = \"x\"\n{rpc}"))
    }

    #[test]
    fn a_unit_of_local_and_remote_servers_parses() {
        let c = cfg(r#"
[rpc]
remote = ["10.0.0.2:50052", "[fd00::2]:50052"]
[[rpc.local]]
command = "/opt/ggml-rpc-server"
args = ["-H", "127.0.0.1", "-p", "{rpc_port}", "-t", "1"]
env = { GGML_RPC_DEBUG = "{rpc_port}" }
[[rpc.local]]
command = "ggml-rpc-server"
port = 50053
"#)
        .unwrap();
        let rpc = c.rpc.clone().unwrap();
        assert_eq!(rpc.local.len(), 2);
        assert_eq!(rpc.local[1].port, Some(50053));
        let spec = rpc.local_spec(0, 40001, None);
        assert_eq!(spec.program, "/opt/ggml-rpc-server");
        assert_eq!(spec.args, ["-H", "127.0.0.1", "-p", "40001", "-t", "1"]);
        assert_eq!(spec.env, [("GGML_RPC_DEBUG".into(), "40001".into())]);
        let remote = rpc.remote_addrs();
        assert_eq!(
            rpc_arg(&remote),
            "10.0.0.2:50052,[fd00::2]:50052",
            "IPv6 in brackets, as llama.cpp reads it"
        );
    }

    #[test]
    fn rpc_config_errors_are_named() {
        let local = "[[rpc.local]]\ncommand = \"r\"\n";
        let cases: &[(String, ConfigError)] = &[
            ("[rpc]\n".into(), ConfigError::RpcNoEndpoints),
            ("[rpc]\nremote = []\n".into(), ConfigError::RpcNoEndpoints),
            (
                "[[rpc.local]]\nargs = [\"-p\", \"{rpc_port}\"]\n".into(),
                ConfigError::RpcNoCommand(1),
            ),
            (
                format!("{local}[[rpc.local]]\ncommand = \" \"\n"),
                ConfigError::RpcNoCommand(2),
            ),
            (
                format!("{local}port = 50052\n{local}port = 50052\n"),
                ConfigError::RpcDuplicatePort(50052),
            ),
            (
                format!("[rpc]\nremote = [\"127.0.0.1:50052\"]\n{local}port = 50052\n"),
                ConfigError::RpcDuplicatePort(50052),
            ),
            (
                "[rpc]\nremote = [\"10.0.0.2:1\", \"10.0.0.2:1\"]\n".into(),
                ConfigError::RpcDuplicatePort(1),
            ),
            (
                "[rpc]\nremote = [\"gpu-box:50052\"]\n".into(),
                ConfigError::RpcBadEndpoint("gpu-box:50052".into()),
            ),
            (
                "[rpc]\nremote = [\"10.0.0.2\"]\n".into(),
                ConfigError::RpcBadEndpoint("10.0.0.2".into()),
            ),
            (
                "[rpc]\nremote = [\"10.0.0.2:0\"]\n".into(),
                ConfigError::RpcBadEndpoint("10.0.0.2:0".into()),
            ),
            (
                format!("{local}port = 0\n"),
                ConfigError::Zero("rpc.local.port"),
            ),
        ];
        for (text, err) in cases {
            assert_eq!(cfg(text).as_ref(), Err(err), "{text}");
        }
        assert_eq!(
            ConfigError::RpcNoCommand(2).to_string(),
            "config: [[rpc.local]] entry 2 has no `command` (the ggml-rpc-server to start)"
        );
        assert_eq!(
            ConfigError::RpcDuplicatePort(50052).to_string(),
            "config: RPC port 50052 is named twice in [rpc]"
        );
        assert_eq!(
            cfg("[rpc]\n").unwrap_err().to_string(),
            "config: [rpc] names no endpoint: add [[rpc.local]] servers or `remote` endpoints"
        );
        // An unknown key inside the section is a TOML error naming it.
        assert!(matches!(
            cfg("[[rpc.local]]\ncommand = \"r\"\nprot = 1\n"),
            Err(ConfigError::Toml(m)) if m.contains("prot")
        ));
    }

    #[test]
    fn the_rpc_example_config_parses() {
        let c = Config::from_toml(include_str!("../llama-worker.rpc.example.toml")).unwrap();
        let rpc = c.rpc.unwrap();
        assert_eq!(rpc.remote, ["10.0.0.2:50052"]);
        assert_eq!(rpc.local.len(), 2);
        assert_eq!((rpc.local[0].port, rpc.local[1].port), (None, Some(50053)));
    }

    #[test]
    fn the_endpoint_limit_and_one_past() {
        let list = |n: usize| {
            (1..=n)
                .map(|p| format!("\"10.0.0.2:{p}\""))
                .collect::<Vec<_>>()
                .join(",")
        };
        assert!(cfg(&format!("[rpc]\nremote = [{}]\n", list(MAX_ENDPOINTS))).is_ok());
        assert_eq!(
            cfg(&format!("[rpc]\nremote = [{}]\n", list(MAX_ENDPOINTS + 1))),
            Err(ConfigError::RpcTooManyEndpoints(MAX_ENDPOINTS + 1))
        );
    }

    #[test]
    fn args_the_worker_adds_itself_are_refused() {
        for flag in WORKER_ARGS {
            let text = format!(
                "command = \"x\"\nargs = [\"-m\", \"m.gguf\", \"{flag}\", \"1\"]\n\
                 [rpc]\nremote = [\"10.0.0.2:50052\"]\n"
            );
            assert_eq!(
                Config::from_toml(&text),
                Err(ConfigError::RpcArgConflict(flag))
            );
        }
        // Without [rpc] they are the operator's business.
        assert!(Config::from_toml("command = \"x\"\nargs = [\"--cache-ram\", \"0\"]").is_ok());
    }

    #[test]
    fn connect_says_accepted_refused_or_cancelled() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = Duration::from_secs(1);
        assert_eq!(connect(addr, t, &|| false), Ok(()));
        assert_eq!(connect(addr, t, &|| true), Err(ProbeError::Cancelled));
        drop(l);
        assert_eq!(connect(addr, t, &|| false), Err(ProbeError::Refused));
    }
}

/// The policy's RPC phase on the fake clock: exact instants, every transition.
#[cfg(test)]
mod policy_tests {
    use std::time::Duration;

    use crate::policy::{
        Action, Endpoints, FailReason, Policy, PolicyConfig, Refusal, RestartCause, State,
    };

    use crate::policy::tests::{drain, s};
    const MS: Duration = Duration::from_millis(1);

    /// The policy tests' numbers, waiting for RPC endpoints before each spawn.
    const CFG: PolicyConfig = PolicyConfig {
        await_endpoints: true,
        ..crate::policy::tests::CFG
    };

    /// Started at 0, RPC servers up at `up`, server spawned then and ready 1 s later.
    fn ready(up: Duration) -> Policy {
        let mut p = Policy::new(CFG);
        p.start(s(0));
        assert_eq!(drain(&mut p), [Action::StartRpc]);
        p.handle_rpc_started(s(0));
        assert!(p.awaiting_endpoints());
        p.handle_rpc_endpoints(up, Endpoints::Up);
        assert_eq!(drain(&mut p), [Action::Spawn]);
        assert!(!p.awaiting_endpoints());
        p.handle_spawned(up);
        p.handle_readiness(up + s(1), crate::policy::Readiness::Ok);
        assert_eq!(p.state(), State::Ready);
        p
    }

    #[test]
    fn the_server_is_spawned_only_once_every_endpoint_accepts() {
        let mut p = Policy::new(CFG);
        p.start(s(0));
        assert_eq!(drain(&mut p), [Action::StartRpc]);
        p.handle_rpc_started(s(0));
        assert_eq!(p.poll_timeout(), Some(s(60)));
        p.handle_rpc_endpoints(MS * 500, Endpoints::LocalDown);
        assert_eq!(drain(&mut p), []);
        assert_eq!(p.admit(), Err(Refusal::NotReady));
        p.handle_rpc_endpoints(s(1), Endpoints::Up);
        assert_eq!(drain(&mut p), [Action::Spawn]);
        p.handle_spawned(s(1));
        // The server's own startup deadline counts from its spawn.
        assert_eq!(p.poll_timeout(), Some(s(61)));
        // A late probe report changes nothing once the server is spawned.
        p.handle_rpc_endpoints(s(2), Endpoints::LocalDown);
        assert_eq!(drain(&mut p), []);
    }

    #[test]
    fn a_local_rpc_server_not_accepting_by_the_deadline_restarts_the_unit() {
        let mut p = Policy::new(CFG);
        p.start(s(0));
        drain(&mut p);
        p.handle_rpc_started(s(0));
        p.handle_rpc_endpoints(s(59), Endpoints::LocalDown);
        p.handle_timeout(s(60) - MS);
        assert_eq!(drain(&mut p), []);
        p.handle_timeout(s(60));
        assert_eq!(p.last_cause(), Some(RestartCause::RpcStartupTimeout));
        assert_eq!(
            drain(&mut p),
            [
                Action::NotifyInflight(FailReason::WorkerRestarted),
                Action::KillGroup
            ]
        );
        p.handle_killed(s(60));
        assert_eq!(p.poll_timeout(), Some(s(62)));
        p.handle_timeout(s(62));
        assert_eq!(drain(&mut p), [Action::StartRpc]);
        assert_eq!(p.consecutive_restarts(s(62)), 1);
    }

    /// A remote endpoint down is another host's outage: waited for past the deadline, never
    /// counted as a restart, the worker not ready all along; when it comes up the server is
    /// spawned. A local one down after the deadline restarts at that report.
    #[test]
    fn a_remote_endpoint_down_is_waited_for_without_a_restart() {
        let mut p = Policy::new(CFG);
        p.start(s(0));
        drain(&mut p);
        p.handle_rpc_started(s(0));
        p.handle_rpc_endpoints(s(1), Endpoints::RemoteDown);
        assert_eq!(
            p.poll_timeout(),
            None,
            "no deadline while only a remote is down"
        );
        for t in [60, 61, 3_600] {
            p.handle_timeout(s(t));
            p.handle_rpc_endpoints(s(t), Endpoints::RemoteDown);
            assert_eq!(drain(&mut p), [], "at {t}");
            assert_eq!(p.state(), State::Starting);
            assert_eq!(p.admit(), Err(Refusal::NotReady));
        }
        assert_eq!((p.total_restarts(), p.last_cause()), (0, None));
        p.handle_rpc_endpoints(s(3_601), Endpoints::Up);
        assert_eq!(drain(&mut p), [Action::Spawn]);

        let mut q = Policy::new(CFG);
        q.start(s(0));
        drain(&mut q);
        q.handle_rpc_started(s(0));
        q.handle_rpc_endpoints(s(59), Endpoints::RemoteDown);
        q.handle_timeout(s(60));
        assert_eq!(drain(&mut q), []);
        q.handle_rpc_endpoints(s(70), Endpoints::LocalDown);
        assert_eq!(q.last_cause(), Some(RestartCause::RpcStartupTimeout));
        assert_eq!(q.state(), State::Restarting);
    }

    #[test]
    fn a_local_rpc_server_exit_restarts_the_whole_unit_and_the_server_died() {
        let mut p = ready(s(1));
        p.handle_rpc_exit(s(40));
        assert_eq!(p.state(), State::Restarting);
        assert_eq!(p.last_cause(), Some(RestartCause::RpcExited));
        assert_eq!(
            drain(&mut p),
            [
                Action::NotifyInflight(FailReason::ServerDied),
                Action::KillGroup
            ]
        );
        // The server aborting right after (its RPC peer is gone) is the same restart.
        p.handle_killed(s(40));
        p.handle_exit(s(40));
        p.handle_rpc_exit(s(40));
        assert_eq!(drain(&mut p), []);
        assert_eq!(p.total_restarts(), 1);
        p.handle_timeout(s(42));
        assert_eq!(drain(&mut p), [Action::StartRpc]);
    }

    /// An RPC server that dies at every start: the crash-loop rule as for a server, `failed`
    /// at the fourth death with `max_restarts_per_window = 3`.
    #[test]
    fn an_rpc_server_dying_at_every_start_ends_failed() {
        let mut p = Policy::new(CFG);
        p.start(s(0));
        let mut now = s(0);
        let mut starts = Vec::new();
        while p.state() != State::Failed {
            match p.poll_action() {
                Some(Action::StartRpc) => {
                    starts.push(now);
                    p.handle_rpc_started(now);
                    now += MS * 300;
                    p.handle_rpc_exit(now);
                }
                Some(Action::KillGroup) => p.handle_killed(now),
                Some(Action::NotifyInflight(r)) => assert_eq!(r, FailReason::ServerDied),
                Some(Action::Spawn) => panic!("the server is never spawned"),
                None => {
                    now = p.poll_timeout().expect("a backoff");
                    p.handle_timeout(now);
                }
            }
        }
        assert_eq!(starts, [Duration::ZERO, MS * 2_300, MS * 4_600, MS * 6_900]);
        assert_eq!(now, MS * 7_200);
        assert_eq!(p.last_cause(), Some(RestartCause::RpcExited));
        // The unit's other RPC servers still run: killed on the way to failed.
        assert_eq!(
            drain(&mut p),
            [
                Action::NotifyInflight(FailReason::ServerDied),
                Action::KillGroup
            ]
        );
        p.handle_killed(now);
        assert!(!p.child_alive());
        assert_eq!(p.poll_timeout(), None);
    }

    #[test]
    fn a_server_spawn_failure_after_the_rpc_servers_started_kills_them() {
        let mut p = Policy::new(CFG);
        p.start(s(0));
        drain(&mut p);
        p.handle_rpc_started(s(0));
        p.handle_rpc_endpoints(s(1), Endpoints::Up);
        drain(&mut p);
        p.handle_spawn_failed(s(1));
        assert_eq!(
            drain(&mut p),
            [
                Action::NotifyInflight(FailReason::ServerDied),
                Action::KillGroup
            ]
        );
    }

    #[test]
    fn stop_while_waiting_for_endpoints_kills_the_rpc_servers_and_spawns_nothing() {
        let mut p = Policy::new(CFG);
        p.start(s(0));
        drain(&mut p);
        p.handle_rpc_started(s(0));
        p.stop(s(1));
        assert_eq!(
            drain(&mut p),
            [
                Action::NotifyInflight(FailReason::WorkerStopped),
                Action::KillGroup
            ]
        );
        p.handle_rpc_endpoints(s(1), Endpoints::Up);
        assert_eq!(drain(&mut p), []);
        assert_eq!(p.poll_timeout(), None);
        // RPC servers whose start lands after the stop are killed.
        let mut q = Policy::new(CFG);
        q.start(s(0));
        drain(&mut q);
        q.stop(s(0));
        drain(&mut q);
        q.handle_rpc_started(s(0));
        assert_eq!(drain(&mut q), [Action::KillGroup]);
    }
}
