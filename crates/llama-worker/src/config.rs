//! The worker's TOML configuration: the server command, its environment, and every number the
//! policy and the probes run on. Unknown keys are an error, so a typo never silently falls back
//! to a default. Defaults suit a real `llama-server` on a CPU: loads take seconds, long
//! prefills minutes. Zero is refused wherever it would turn a safety off or make a loop spin.

use core::fmt;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::policy::PolicyConfig;
use crate::rpc::{RpcConfig, WORKER_ARGS};

/// The placeholder in `args` and `env` values that is replaced by the assigned port.
pub const PORT_PLACEHOLDER: &str = "{port}";

/// How much of `command --version`'s stderr [`Config::check_runs`] reads for the loader's
/// message; the rest is drained unread.
const STDERR_KEPT: u64 = 16 * 1024;

/// Longest accepted duration, in seconds (a week): longer is surely a typo.
pub const MAX_SECONDS: f64 = 7.0 * 24.0 * 3600.0;

/// The configuration as written in the TOML file. Every key but `command` is optional.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The server executable (path or name on `PATH`).
    pub command: String,
    /// Its arguments; [`PORT_PLACEHOLDER`] is replaced by the port.
    pub args: Vec<String>,
    /// Extra environment variables (added to the worker's own); `{port}` is replaced in values.
    pub env: BTreeMap<String, String>,
    /// Where the child's stdout and stderr are appended; unset: inherited from the worker.
    pub log_file: Option<PathBuf>,
    /// The host the readiness probes connect to.
    pub host: String,
    /// Every path must answer 200 within `probe_timeout_s` for the server to count as ready.
    pub readiness_paths: Vec<String>,
    /// Router mode: the model ids (as in the preset) that must be loaded for the server to count
    /// as ready, read from the router's `GET /models` after the readiness paths answered 200.
    /// A model the router marks failed (its instance exited) is a crash-loop event like the
    /// server's own exit ([`crate::models`]). Empty (the default): no model check, for a server
    /// that is not a router.
    pub models: Vec<String>,
    /// Where the daemon serves its status JSON (mode 0600); `--socket` overrides it.
    pub status_socket: Option<PathBuf>,
    /// From spawn to the first good readiness answer, at most (default 120).
    pub startup_deadline_s: f64,
    /// Between readiness probes while starting (default 0.5).
    pub startup_probe_interval_s: f64,
    /// Between readiness probes while ready (default 5).
    pub probe_interval_s: f64,
    /// One readiness probe's deadline, connect to status line; slower is a failure (default 5).
    pub probe_timeout_s: f64,
    /// While ready, readiness failing this long with flat CPU time restarts (default 30).
    pub unready_restart_s: f64,
    /// Between `/proc` CPU-time samples of the process group (default 5).
    pub cpu_probe_interval_s: f64,
    /// A registered generation without progress this long restarts the server, and a reported
    /// stall restarts only after this long without progress (default 30: no longer than
    /// loopd's default `limits.liveness_ms`; at least twice `cpu_probe_interval_s`).
    pub stall_timeout_s: f64,
    /// Ready this long sets the crash-loop restart count back to zero (default 600).
    pub restart_window_s: f64,
    /// More restarts in a row than this (see [`crate::policy`]) makes the worker failed
    /// (default 5).
    pub max_restarts_per_window: u32,
    /// Wait between killing the old server and spawning the next (default 2).
    pub restart_backoff_s: f64,
    /// After SIGTERM to the group, wait this long before SIGKILL (default 5).
    pub stop_grace_s: f64,
    /// Where the counters are written in the Prometheus text format every
    /// `metrics_interval_s` (atomically: a temporary file in the same folder, then a rename),
    /// e.g. for node_exporter's textfile collector; unset (the default): not written.
    pub metrics_file: Option<PathBuf>,
    /// Between writes of `metrics_file` (default 15).
    pub metrics_interval_s: f64,
    /// llama.cpp's RPC backend: the `ggml-rpc-server`s the model is split over, started or
    /// checked by the worker as one unit with the server ([`crate::rpc`]). Unset: no RPC.
    pub rpc: Option<RpcConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            command: String::new(),
            args: Vec::new(),
            env: BTreeMap::new(),
            log_file: None,
            host: "127.0.0.1".into(),
            readiness_paths: vec!["/health".into(), "/v1/models".into()],
            models: Vec::new(),
            status_socket: None,
            startup_deadline_s: 120.0,
            startup_probe_interval_s: 0.5,
            probe_interval_s: 5.0,
            probe_timeout_s: 5.0,
            unready_restart_s: 30.0,
            cpu_probe_interval_s: 5.0,
            stall_timeout_s: 30.0,
            restart_window_s: 600.0,
            max_restarts_per_window: 5,
            restart_backoff_s: 2.0,
            stop_grace_s: 5.0,
            metrics_file: None,
            metrics_interval_s: 15.0,
            rpc: None,
        }
    }
}

/// What was wrong with a configuration.
///
/// Not `Copy`: the TOML case carries the parser's message (line, column, key), which is what
/// an operator needs to fix the file.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// Not valid TOML, a wrong type, or an unknown key.
    Toml(String),
    /// `command` is missing or empty.
    NoCommand,
    /// This readiness path does not start with `/` or holds a space or control byte.
    BadReadinessPath(String),
    /// `readiness_paths` is empty.
    NoReadinessPath,
    /// This entry of `models` is empty, holds a control byte, or is listed twice.
    BadModel(String),
    /// The named duration is negative, not finite, or longer than [`MAX_SECONDS`].
    BadDuration(&'static str),
    /// The named key is zero, which would turn a safety off or make a loop spin.
    Zero(&'static str),
    /// Reading the file failed.
    Read(std::io::ErrorKind),
    /// `command` is not a file (as a path, or in any `PATH` folder for a bare name).
    CommandNotFound(String),
    /// `command` is a file without an execute bit.
    CommandNotExecutable(PathBuf),
    /// The folder `log_file` would be created in does not exist.
    NoLogFolder(PathBuf),
    /// `command --version` could not start: the dynamic loader named this missing library
    /// (`libgomp.so.1`).
    CommandMissingLibrary(String, String),
    /// `command --version` did not run: how it ended (exit 127 and its stderr's last line,
    /// a signal, no answer in time, or the exec's error).
    CommandDoesNotRun(String, String),
    /// `[rpc]` is there but names no local server and no remote endpoint.
    RpcNoEndpoints,
    /// `[rpc]` names more endpoints than [`crate::rpc::MAX_ENDPOINTS`] (this many).
    RpcTooManyEndpoints(usize),
    /// `[[rpc.local]]` entry number `.0` (from 1) has no `command`.
    RpcNoCommand(usize),
    /// This port is named twice in `[rpc]` (two local servers, or a local and a remote one on
    /// 127.0.0.1, or a remote endpoint listed twice).
    RpcDuplicatePort(u16),
    /// `[[rpc.local]]` entry number `.0` (from 1) has the fixed port `.1`, which is the
    /// server's own `--port`.
    RpcServerPort(usize, u16),
    /// This remote endpoint is not `ip:port` (a host name is refused: see [`crate::rpc`]).
    RpcBadEndpoint(String),
    /// `args` hold this flag, which the worker adds itself when `[rpc]` is set.
    RpcArgConflict(&'static str),
    /// Two keys contradict the timeline: `.0` must be at least twice `.1`.
    ShorterThanTwice(&'static str, &'static str),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Toml(m) => write!(f, "config: {m}"),
            Self::NoCommand => f.write_str("config: `command` is missing or empty"),
            Self::BadReadinessPath(p) => write!(
                f,
                "config: readiness path {p:?} must start with '/' and hold no spaces or control bytes"
            ),
            Self::NoReadinessPath => f.write_str("config: `readiness_paths` is empty"),
            Self::BadModel(m) => write!(
                f,
                "config: model id {m:?} in `models` is empty, holds a control byte, or is listed twice"
            ),
            Self::BadDuration(k) => write!(
                f,
                "config: `{k}` must be a finite number of seconds in 0..={MAX_SECONDS}"
            ),
            Self::Zero(k) => write!(f, "config: `{k}` must be greater than 0"),
            Self::ShorterThanTwice(k, other) => write!(
                f,
                "config: `{k}` must be at least twice `{other}` (a generation in prefill shows \
                 progress only as a rise between two of its samples)"
            ),
            Self::Read(k) => write!(f, "config: cannot read the file: {k}"),
            Self::CommandNotFound(c) => write!(
                f,
                "config: `command` {c:?} is not a file (a bare name is looked up in PATH)"
            ),
            Self::CommandNotExecutable(p) => {
                write!(f, "config: `command` {} is not executable", p.display())
            }
            Self::CommandMissingLibrary(c, lib) => write!(
                f,
                "config: `command` {c} cannot start: the library {lib} is missing (`ldd {c}` \
                 lists what it needs; docs/production.md's apt-get line installs llama-server's)"
            ),
            Self::CommandDoesNotRun(c, how) => {
                write!(f, "config: `command` {c} does not run: `{c} --version` {how}")
            }
            Self::NoLogFolder(d) => write!(
                f,
                "config: the folder of `log_file` does not exist: {}",
                d.display()
            ),
            Self::RpcNoEndpoints => f.write_str(
                "config: [rpc] names no endpoint: add [[rpc.local]] servers or `remote` endpoints",
            ),
            Self::RpcTooManyEndpoints(n) => write!(
                f,
                "config: [rpc] names {n} endpoints, more than {}",
                crate::rpc::MAX_ENDPOINTS
            ),
            Self::RpcNoCommand(i) => write!(
                f,
                "config: [[rpc.local]] entry {i} has no `command` (the ggml-rpc-server to start)"
            ),
            Self::RpcDuplicatePort(p) => write!(f, "config: RPC port {p} is named twice in [rpc]"),
            Self::RpcServerPort(i, p) => write!(
                f,
                "config: [[rpc.local]] entry {i} has port {p}, the server's own --port"
            ),
            Self::RpcBadEndpoint(e) => write!(
                f,
                "config: RPC endpoint {e:?} in `rpc.remote` is not ip:port (IPv6: [ip]:port)"
            ),
            Self::RpcArgConflict(a) => write!(
                f,
                "config: `args` hold {a}, which the worker adds itself when [rpc] is set"
            ),
        }
    }
}

impl core::error::Error for ConfigError {}

/// The command line to spawn, with the port substituted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandSpec {
    /// The executable.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// Where stdout and stderr go (appended), or inherited.
    pub log_file: Option<PathBuf>,
}

/// The validated time settings, as [`Duration`]s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    /// The policy's part.
    pub policy: PolicyConfig,
    /// `startup_probe_interval_s`.
    pub startup_probe_interval: Duration,
    /// `probe_interval_s`.
    pub probe_interval: Duration,
    /// `probe_timeout_s`.
    pub probe_timeout: Duration,
    /// `cpu_probe_interval_s`.
    pub cpu_probe_interval: Duration,
    /// `stop_grace_s`.
    pub stop_grace: Duration,
    /// `metrics_interval_s`.
    pub metrics_interval: Duration,
}

impl Config {
    /// Parses and validates a TOML document.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Toml(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads, parses and validates a TOML file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read(e.kind()))?;
        Self::from_toml(&text)
    }

    /// Checks everything [`Config::timings`] and the probes rely on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.command.trim().is_empty() {
            return Err(ConfigError::NoCommand);
        }
        if self.readiness_paths.is_empty() {
            return Err(ConfigError::NoReadinessPath);
        }
        for p in &self.readiness_paths {
            if !p.starts_with('/') || p.bytes().any(|b| b <= b' ' || b == 0x7f) {
                return Err(ConfigError::BadReadinessPath(p.clone()));
            }
        }
        for (i, m) in self.models.iter().enumerate() {
            if m.trim().is_empty()
                || m.chars().any(char::is_control)
                || self.models[..i].contains(m)
            {
                return Err(ConfigError::BadModel(m.clone()));
            }
        }
        if let Some(rpc) = &self.rpc {
            rpc.validate()?;
            if let Some(a) = WORKER_ARGS.into_iter().find(|w| {
                self.args
                    .iter()
                    .any(|a| a == w || a.starts_with(&format!("{w}=")))
            }) {
                return Err(ConfigError::RpcArgConflict(a));
            }
        }
        self.timings().map(|_| ())
    }

    /// [`Config::validate`], and what only the server's `port` shows: no `[[rpc.local]]`
    /// server may take it. [`crate::Worker::new`] refuses what this refuses; `llama-worker
    /// run` and `check-config` call it (with [`Config::check_files`]) before anything starts,
    /// so the two commands cannot disagree on a config.
    pub fn validate_for_port(&self, port: u16) -> Result<(), ConfigError> {
        self.validate()?;
        let locals = self.rpc.iter().flat_map(|r| &r.local);
        if let Some(i) = locals.clone().position(|l| l.port == Some(port)) {
            return Err(ConfigError::RpcServerPort(i + 1, port));
        }
        Ok(())
    }

    /// Checks what [`Config::validate`] cannot see in the text: that `command` is an executable
    /// file (a bare name is looked up in `PATH`, the config's `env` one if it sets one, as the
    /// spawn does) and that the folder `log_file` goes in exists. `check-config` and `run` call
    /// it, so a typo shows at once instead of as a spawn failure in a restart loop.
    pub fn check_files(&self) -> Result<(), ConfigError> {
        check_command(&self.command, &self.env)?;
        for l in self.rpc.iter().flat_map(|r| &r.local) {
            check_command(&l.command, &l.env)?;
        }
        if let Some(log) = &self.log_file {
            let folder = match log.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            if !folder.is_dir() {
                return Err(ConfigError::NoLogFolder(folder.to_path_buf()));
            }
        }
        Ok(())
    }

    /// Whether a missing `log_file` folder is one a service manager makes at start: its
    /// parent exists (`/var/log` for systemd's `LogsDirectory=`). `check-config` then says
    /// so in a note instead of refusing; `run` still needs the folder.
    pub fn log_folder_made_at_start(&self, e: &ConfigError) -> bool {
        match e {
            ConfigError::NoLogFolder(d) => d.parent().is_some_and(Path::is_dir),
            _ => false,
        }
    }

    /// Runs `command --version` (with the config's `env`, as the spawn does) and waits at most
    /// `timeout`: a binary whose libraries are missing (exit 127 from the dynamic loader, the
    /// library named), that dies on a signal (an instruction the CPU lacks), or that does not
    /// answer in time is refused. Any other exit status is the program's own answer: it ran.
    /// Only `check-config` calls it; `run` finds out from the server's first exit.
    pub fn check_runs(&self, timeout: Duration) -> Result<(), ConfigError> {
        use std::os::unix::process::ExitStatusExt;
        let c = self.command.trim();
        let refuse = |how: String| ConfigError::CommandDoesNotRun(c.to_string(), how);
        let ran = crate::process::run_briefly(c, &["--version"], &self.env, timeout, STDERR_KEPT)
            .map_err(|e| refuse(format!("could not be started: {e}")))?;
        let Some(status) = ran.status else {
            return Err(refuse(format!(
                "did not exit within {} s (killed)",
                timeout.as_secs_f64()
            )));
        };
        let stderr = ran.stderr;
        const LOADER: &str = "error while loading shared libraries: ";
        if let Some(rest) = stderr.split_once(LOADER).map(|(_, r)| r) {
            let lib = rest.split(':').next().unwrap_or(rest).trim();
            return Err(ConfigError::CommandMissingLibrary(
                c.to_string(),
                lib.to_string(),
            ));
        }
        let last = stderr.lines().rev().find(|l| !l.trim().is_empty());
        match (status.code(), status.signal()) {
            (Some(127), _) => Err(refuse(format!(
                "exited 127: {}",
                last.unwrap_or("(nothing on stderr)")
            ))),
            (_, Some(sig)) => Err(refuse(format!("was killed by signal {sig}"))),
            _ => Ok(()),
        }
    }

    /// The durations, validated.
    pub fn timings(&self) -> Result<Timings, ConfigError> {
        let d = |k: &'static str, v: f64| -> Result<Duration, ConfigError> {
            if !(0.0..=MAX_SECONDS).contains(&v) {
                return Err(ConfigError::BadDuration(k));
            }
            Ok(Duration::from_secs_f64(v))
        };
        let nz = |k: &'static str, v: f64| -> Result<Duration, ConfigError> {
            let x = d(k, v)?;
            if x.is_zero() {
                return Err(ConfigError::Zero(k));
            }
            Ok(x)
        };
        let stall_timeout = nz("stall_timeout_s", self.stall_timeout_s)?;
        let cpu_probe_interval = nz("cpu_probe_interval_s", self.cpu_probe_interval_s)?;
        if stall_timeout < cpu_probe_interval * 2 {
            return Err(ConfigError::ShorterThanTwice(
                "stall_timeout_s",
                "cpu_probe_interval_s",
            ));
        }
        Ok(Timings {
            policy: PolicyConfig {
                startup_deadline: nz("startup_deadline_s", self.startup_deadline_s)?,
                unready_restart_after: nz("unready_restart_s", self.unready_restart_s)?,
                stall_timeout,
                restart_window: nz("restart_window_s", self.restart_window_s)?,
                max_restarts_per_window: match self.max_restarts_per_window {
                    0 => return Err(ConfigError::Zero("max_restarts_per_window")),
                    n => n,
                },
                restart_backoff: d("restart_backoff_s", self.restart_backoff_s)?,
                await_endpoints: self.rpc.is_some(),
            },
            startup_probe_interval: nz("startup_probe_interval_s", self.startup_probe_interval_s)?,
            probe_interval: nz("probe_interval_s", self.probe_interval_s)?,
            probe_timeout: nz("probe_timeout_s", self.probe_timeout_s)?,
            cpu_probe_interval,
            stop_grace: d("stop_grace_s", self.stop_grace_s)?,
            metrics_interval: nz("metrics_interval_s", self.metrics_interval_s)?,
        })
    }

    /// The command line for `port`: [`PORT_PLACEHOLDER`] replaced in args and env values.
    pub fn command_spec(&self, port: u16) -> CommandSpec {
        let p = port.to_string();
        CommandSpec {
            program: self.command.clone(),
            args: self
                .args
                .iter()
                .map(|a| a.replace(PORT_PLACEHOLDER, &p))
                .collect(),
            env: self
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.replace(PORT_PLACEHOLDER, &p)))
                .collect(),
            log_file: self.log_file.clone(),
        }
    }
}

/// That `command` names an executable file: a path, or a bare name looked up in `PATH` (the
/// one in `env` if it sets one, as the spawn does).
fn check_command(command: &str, env: &BTreeMap<String, String>) -> Result<(), ConfigError> {
    let command = command.trim();
    let candidates: Vec<PathBuf> = if command.contains('/') {
        vec![PathBuf::from(command)]
    } else {
        let path = env
            .get("PATH")
            .map(OsString::from)
            .or_else(|| std::env::var_os("PATH"))
            .unwrap_or_default();
        std::env::split_paths(&path)
            .map(|d| d.join(command))
            .collect()
    };
    // Like execvp: the first executable match wins; a non-executable one is reported
    // only when there is no executable one anywhere.
    let mut not_executable = None;
    for c in candidates {
        let Ok(m) = fs::metadata(&c) else { continue };
        if !m.is_file() {
            continue;
        }
        if m.permissions().mode() & 0o111 != 0 {
            return Ok(());
        }
        not_executable.get_or_insert(c);
    }
    Err(match not_executable {
        Some(p) => ConfigError::CommandNotExecutable(p),
        None => ConfigError::CommandNotFound(command.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_config_takes_the_defaults() {
        let c = Config::from_toml("command = \"llama-server\"").unwrap();
        assert_eq!(
            c,
            Config {
                command: "llama-server".into(),
                ..Config::default()
            }
        );
        let t = c.timings().unwrap();
        assert_eq!(t.policy.startup_deadline, Duration::from_secs(120));
        assert_eq!(t.policy.max_restarts_per_window, 5);
        assert_eq!(t.probe_timeout, Duration::from_secs(5));
        assert_eq!(t.startup_probe_interval, Duration::from_millis(500));
    }

    #[test]
    fn full_config_and_port_substitution() {
        let c = Config::from_toml(
            r#"
command = "/opt/llama-server"
args = ["--models-preset", "p.ini", "--port", "{port}", "--host", "127.0.0.1"]
env = { LLAMA_ARG_PORT = "{port}", A = "b" }
readiness_paths = ["/health"]
status_socket = "/run/lw.sock"
max_restarts_per_window = 2
restart_backoff_s = 0
stop_grace_s = 0.25
"#,
        )
        .unwrap();
        let spec = c.command_spec(8081);
        assert_eq!(spec.program, "/opt/llama-server");
        assert_eq!(
            spec.args,
            [
                "--models-preset",
                "p.ini",
                "--port",
                "8081",
                "--host",
                "127.0.0.1"
            ]
        );
        assert_eq!(
            spec.env,
            [
                ("A".to_string(), "b".to_string()),
                ("LLAMA_ARG_PORT".to_string(), "8081".to_string())
            ]
        );
        let t = c.timings().unwrap();
        assert_eq!(t.stop_grace, Duration::from_millis(250));
        assert_eq!(t.policy.restart_backoff, Duration::ZERO);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_typed_errors() {
        assert!(matches!(
            Config::from_toml("command = \"x\"\nrestart_backof_s = 1"),
            Err(ConfigError::Toml(m)) if m.contains("restart_backof_s")
        ));
        assert!(matches!(
            Config::from_toml("command = \"x\"\nmax_restarts_per_window = -1"),
            Err(ConfigError::Toml(_))
        ));
        let cases: &[(&str, ConfigError)] = &[
            ("", ConfigError::NoCommand),
            ("command = \"  \"", ConfigError::NoCommand),
            (
                "command = \"x\"\nreadiness_paths = []",
                ConfigError::NoReadinessPath,
            ),
            (
                "command = \"x\"\nreadiness_paths = [\"health\"]",
                ConfigError::BadReadinessPath("health".into()),
            ),
            (
                "command = \"x\"\nreadiness_paths = [\"/health\", \"/a b\"]",
                ConfigError::BadReadinessPath("/a b".into()),
            ),
            (
                "command = \"x\"\nmodels = [\"a\", \"\"]",
                ConfigError::BadModel(String::new()),
            ),
            (
                "command = \"x\"\nmodels = [\"a\", \"b\\n\"]",
                ConfigError::BadModel("b\n".into()),
            ),
            (
                "command = \"x\"\nmodels = [\"a\", \"b\", \"a\"]",
                ConfigError::BadModel("a".into()),
            ),
            (
                "command = \"x\"\nstall_timeout_s = -1",
                ConfigError::BadDuration("stall_timeout_s"),
            ),
            (
                "command = \"x\"\nstall_timeout_s = nan",
                ConfigError::BadDuration("stall_timeout_s"),
            ),
            (
                "command = \"x\"\nstall_timeout_s = inf",
                ConfigError::BadDuration("stall_timeout_s"),
            ),
            (
                "command = \"x\"\nprobe_timeout_s = 0",
                ConfigError::Zero("probe_timeout_s"),
            ),
            (
                "command = \"x\"\ncpu_probe_interval_s = 0.0",
                ConfigError::Zero("cpu_probe_interval_s"),
            ),
        ];
        for (text, err) in cases {
            assert_eq!(Config::from_toml(text).as_ref(), Err(err), "{text:?}");
        }
    }

    /// Zero would turn crash-loop protection off (a zero window or count), restart on the first
    /// failed probe, or make every stall report restart: refused with the key named. The
    /// smallest positive value is accepted.
    #[test]
    fn zero_that_disables_a_safety_is_refused_with_the_key() {
        for key in [
            "restart_window_s",
            "max_restarts_per_window",
            "stall_timeout_s",
            "unready_restart_s",
            "startup_deadline_s",
        ] {
            let zero = format!("command = \"x\"\n{key} = 0");
            let err = Config::from_toml(&zero).unwrap_err();
            assert_eq!(err, ConfigError::Zero(key));
            assert_eq!(
                err.to_string(),
                format!("config: `{key}` must be greater than 0")
            );
            let one = format!("command = \"x\"\ncpu_probe_interval_s = 0.5\n{key} = 1");
            assert!(Config::from_toml(&one).is_ok(), "{key}");
        }
        let tiny = "command = \"x\"\nunready_restart_s = 0.001\nrestart_window_s = 0.001";
        let t = Config::from_toml(tiny).unwrap().timings().unwrap();
        assert_eq!(t.policy.unready_restart_after, Duration::from_millis(1));
        // The stall timeout judges prefill by CPU-time samples: two of them at least.
        let text = "command = \"x\"\ncpu_probe_interval_s = 0.5\nstall_timeout_s = 0.999";
        let err = Config::from_toml(text).unwrap_err();
        assert_eq!(
            err,
            ConfigError::ShorterThanTwice("stall_timeout_s", "cpu_probe_interval_s")
        );
        assert!(err.to_string().starts_with(
            "config: `stall_timeout_s` must be at least twice `cpu_probe_interval_s`"
        ));
        let limit = "command = \"x\"\ncpu_probe_interval_s = 0.5\nstall_timeout_s = 1";
        assert!(Config::from_toml(limit).is_ok());
        // Zero stays allowed where it means "at once": no backoff, SIGKILL without grace.
        let c = Config::from_toml("command = \"x\"\nrestart_backoff_s = 0\nstop_grace_s = 0");
        assert!(c.is_ok());
    }

    #[test]
    fn a_bad_readiness_path_is_named_in_the_message() {
        let err = Config::from_toml("command = \"x\"\nreadiness_paths = [\"/ok\", \"v1/models\"]")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "config: readiness path \"v1/models\" must start with '/' and hold no spaces or \
             control bytes"
        );
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("lw-config-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn check_files_finds_the_command_and_the_log_folder() {
        let dir = scratch("files");
        let plain = dir.join("plain");
        fs::write(&plain, "#!/bin/sh\n").unwrap();
        fs::set_permissions(&plain, fs::Permissions::from_mode(0o644)).unwrap();
        let with = |command: &str, log: Option<PathBuf>| Config {
            command: command.into(),
            log_file: log,
            ..Config::default()
        };
        assert_eq!(with("/bin/sh", None).check_files(), Ok(()));
        assert_eq!(with("sh", Some("server.log".into())).check_files(), Ok(()));
        assert_eq!(
            with("/bin/sh", Some(dir.join("server.log"))).check_files(),
            Ok(())
        );
        assert_eq!(
            with("/nonexistent/llama-server", None).check_files(),
            Err(ConfigError::CommandNotFound(
                "/nonexistent/llama-server".into()
            ))
        );
        assert_eq!(
            with("no-such-llama-server-here", None).check_files(),
            Err(ConfigError::CommandNotFound(
                "no-such-llama-server-here".into()
            ))
        );
        assert_eq!(
            with(dir.to_str().unwrap(), None).check_files(),
            Err(ConfigError::CommandNotFound(dir.display().to_string())),
            "a folder is not a command"
        );
        assert_eq!(
            with(plain.to_str().unwrap(), None).check_files(),
            Err(ConfigError::CommandNotExecutable(plain.clone()))
        );
        // A bare name is looked up in the config's own PATH when it sets one.
        let mut c = with("plain", None);
        c.env
            .insert("PATH".into(), format!("/nonexistent:{}", dir.display()));
        assert_eq!(
            c.check_files(),
            Err(ConfigError::CommandNotExecutable(plain.clone()))
        );
        fs::set_permissions(&plain, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(c.check_files(), Ok(()));
        let missing = dir.join("logs");
        let err = with("/bin/sh", Some(missing.join("server.log")))
            .check_files()
            .unwrap_err();
        assert_eq!(err, ConfigError::NoLogFolder(missing.clone()));
        assert_eq!(
            err.to_string(),
            format!(
                "config: the folder of `log_file` does not exist: {}",
                missing.display()
            )
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_example_config_parses_and_states_the_defaults() {
        let text = include_str!("../llama-worker.example.toml");
        let c = Config::from_toml(text).unwrap();
        let d = Config::default();
        assert_eq!(
            Config {
                command: d.command.clone(),
                args: d.args.clone(),
                log_file: None,
                status_socket: None,
                metrics_file: None,
                models: d.models.clone(),
                ..c
            },
            d
        );
    }

    #[test]
    fn duration_limit_and_one_past() {
        let at = format!("command = \"x\"\nrestart_window_s = {MAX_SECONDS:.1}");
        assert!(Config::from_toml(&at).is_ok());
        let past = format!(
            "command = \"x\"\nrestart_window_s = {:.1}",
            MAX_SECONDS + 1.0
        );
        assert_eq!(
            Config::from_toml(&past),
            Err(ConfigError::BadDuration("restart_window_s"))
        );
    }
}
