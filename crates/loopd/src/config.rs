//! `config.toml` into a typed [`Config`].
//!
//! Unknown keys are errors. Every limit of the design's section 4 is a field with the default
//! given there, so a config file names only what it changes. A default that depends on another
//! key follows that key when the file leaves it out (`runner.stall_ms` is `limits.liveness_ms`,
//! `retry.delays_ms` fits `retry.attempts`), so only a value the file wrote is refused. A
//! [`ConfigError`] names the file, the line and the dotted key that was wrong.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use loopd_agent::fleet::{Fleet, HostConfig, PlacementPolicy};
use loopd_agent::runner::RunnerConfig;
use loopd_client::config::{Expect, Limits, Retry, Sampling, SHA256_HEX_DIGITS};
use loopd_client::ClientConfig;

#[cfg(test)]
mod runner;

/// The whole of `config.toml`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The Unix socket inferproxy listens on; loopd reaches the model only through it.
    pub socket: PathBuf,
    /// The model id the router serves (sent as `model` in every request and query).
    pub model: String,
    /// The timers and caps of one request.
    #[serde(default)]
    pub limits: Limits,
    /// The retry schedule of `chat_with_retry`.
    #[serde(default)]
    pub retry: Retry,
    /// Sampling settings; an unset one is left to the server's default.
    #[serde(default)]
    pub sampling: Sampling,
    /// What the startup self-test expects of the server.
    pub expect: Option<Expect>,
    /// The request runner: tool budget, tool timeout, worker socket, stalls, loop detector.
    #[serde(default)]
    pub runner: RunnerConfig,
    /// `loopd serve`: its client socket and metrics file.
    #[serde(default)]
    pub daemon: Daemon,
    /// How `loopd serve` places a new request on its `[[host]]`s: `affinity` (the default:
    /// a session goes back to its host) or `round_robin` (to measure affinity against).
    #[serde(default)]
    pub placement: PlacementPolicy,
    /// The inference hosts of `loopd serve` (docs/fleet.md). None: its one host is `socket`
    /// and `runner.worker_socket`, as for every other command.
    #[serde(default)]
    pub host: Vec<HostConfig>,
    /// `loopd serve`'s sessions: their caps and the compaction's summary (docs/sessions.md).
    #[serde(default)]
    pub sessions: Sessions,
}

/// `[sessions]`: the caps of `loopd serve`'s sessions and the length of a compaction's
/// summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sessions {
    /// Sessions kept at most; an `open` past it is refused `SESSION_FULL` (1000).
    pub max_sessions: usize,
    /// A session's log in bytes (its records' JSON): a turn is taken while the log holds
    /// fewer, and refused `SESSION_FULL` once it holds this many (8 MiB: with the last turn's
    /// records, at most a few MiB more, `history` stays under a client's 16 MiB reply line).
    pub max_log_bytes: u64,
    /// The `max_tokens` of a compaction's summary (256).
    pub summary_max_tokens: u64,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions {
            max_sessions: 1000,
            max_log_bytes: 8 << 20,
            summary_max_tokens: 256,
        }
    }
}

/// `[daemon]`: where `loopd serve` listens and writes its metrics.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Daemon {
    /// The client socket of `loopd serve` (mode 0600); `loopd submit|result|cancel|status`
    /// and `loopd run --daemon` connect to it. Required by `loopd serve`.
    pub socket: Option<PathBuf>,
    /// A file the daemon writes its metrics to (atomically, every second) for
    /// node_exporter's textfile collector; none by default.
    pub metrics_file: Option<PathBuf>,
    /// The durable store of requests and results (SQLite). Unset: `loopd.db` in
    /// `$STATE_DIRECTORY` (systemd's `StateDirectory=`), else in `$XDG_STATE_HOME/loopd/`,
    /// else in `~/.local/state/loopd/` ([`store_path`](crate::daemon::store_path)).
    pub store: Option<PathBuf>,
    /// `normal` (the default: a commit survives the daemon's death, not always a power loss)
    /// or `full` (an fsync per commit: it survives a power loss too).
    pub store_sync: crate::daemon::Durability,
}

/// Why a config file was refused: the file, the 1-based line and the dotted key.
#[derive(Debug)]
pub struct ConfigError {
    /// The file that was read.
    pub path: PathBuf,
    /// 1-based line of the offending key (1 when the file could not be read).
    pub line: usize,
    /// The dotted key (`limits.poll_ms`), or empty when no key is to blame.
    pub key: String,
    /// What was wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: ", self.path.display(), self.line)?;
        if !self.key.is_empty() {
            write!(f, "key `{}`: ", self.key)?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// A config with every default, for tests and tools that build one in code.
    pub fn new(socket: impl Into<PathBuf>, model: impl Into<String>) -> Config {
        Config {
            socket: socket.into(),
            model: model.into(),
            limits: Limits::default(),
            retry: Retry::default(),
            sampling: Sampling::default(),
            expect: None,
            runner: RunnerConfig::default(),
            daemon: Daemon::default(),
            placement: PlacementPolicy::default(),
            host: Vec::new(),
            sessions: Sessions::default(),
        }
    }

    /// The client's sections: what [`Client::new`](loopd_client::Client::new) is given.
    pub fn client(&self) -> ClientConfig {
        ClientConfig {
            socket: self.socket.clone(),
            model: self.model.clone(),
            limits: self.limits,
            retry: self.retry.clone(),
            sampling: self.sampling,
            expect: self.expect.clone(),
        }
    }

    /// The `[[host]]` list, checked; `None` when the file names no host (then `socket` and
    /// `runner.worker_socket` are the one host).
    pub fn fleet(&self) -> Option<Fleet> {
        if self.host.is_empty() {
            return None;
        }
        let total = self.expect.as_ref().map_or(u32::MAX, |e| e.total_slots);
        Fleet::new(self.host.clone(), total).ok()
    }

    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            path: path.to_owned(),
            line: 1,
            key: String::new(),
            message: format!("cannot read: {e}"),
        })?;
        Config::parse(path, &text)
    }

    /// Parses `text`, naming `path` in any error.
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| {
            let offset = e.span().map_or(0, |s| s.start);
            let (line, mut key) = key_at(text, offset);
            // The toml crate gives some refusals no words (a control character in a
            // comment): the character and its column say what is wrong.
            let message = match e.message() {
                "" => unexpected_at(text, offset),
                m => m.to_owned(),
            };
            // serde names the key in the message when the span covers a whole table: an
            // unknown table sits in the one before it, a missing key in the one spanned.
            if let Some(named) = backticked_after(&message, "unknown field ") {
                key = join(&table_before(text, offset), &named);
            } else if let Some(named) = backticked_after(&message, "missing field ") {
                let on_header = text[line_start(text, offset)..]
                    .trim_start()
                    .starts_with('[');
                let table = if on_header {
                    key.clone()
                } else {
                    table_before(text, offset)
                };
                key = join(&table, &named);
            }
            ConfigError {
                path: path.to_owned(),
                line,
                key,
                message,
            }
        })?;
        // The text parsed as `Config`, so it parses as a table: which keys the file wrote.
        let written: toml::Table = text.parse().unwrap_or_default();
        config.follow_defaults(&written);
        config
            .validate()
            .map_err(|(table, field, message)| ConfigError {
                path: path.to_owned(),
                line: line_of(text, table, field),
                key: join(table, field),
                message,
            })?;
        if !config.host.is_empty() {
            let total = config.expect.as_ref().map_or(u32::MAX, |e| e.total_slots);
            if let Err(e) = Fleet::new(config.host.clone(), total) {
                let at = match e.key().strip_prefix("host[") {
                    Some(rest) => rest
                        .split(']')
                        .next()
                        .and_then(|i| i.parse::<usize>().ok())
                        .unwrap_or(0),
                    None => 0,
                };
                let shown = e.to_string();
                let prefix = format!("key `{}`: ", e.key());
                return Err(ConfigError {
                    path: path.to_owned(),
                    line: nth_host_line(text, at),
                    key: e.key(),
                    message: shown.strip_prefix(&prefix).unwrap_or(&shown).to_owned(),
                });
            }
        }
        Ok(config)
    }

    /// Gives each key whose default depends on another key, where the file left it out, the
    /// value that follows that key; so changing one key alone never makes a pair contradict,
    /// and only a value the file wrote is refused.
    fn follow_defaults(&mut self, written: &toml::Table) {
        let set = |table: &str, key: &str| is_written(written, table, key);
        if !set("retry", "delays_ms") {
            self.retry.delays_ms = Retry::delays_for(self.retry.attempts);
        }
        if !set("runner", "stall_ms") {
            self.runner.stall_ms = self.limits.liveness_ms;
        }
        let tiers = "runner.loop_detector";
        let detector = &mut self.runner.loop_detector;
        match (set(tiers, "medium_from"), set(tiers, "long_from")) {
            (true, false) => detector.long_from = detector.long_from.max(detector.medium_from),
            (false, true) => detector.medium_from = detector.medium_from.min(detector.long_from),
            _ => {}
        }
    }

    /// Checks what the types cannot: `(table, key, message)` of the first bad value.
    fn validate(&self) -> Result<(), (&'static str, &'static str, String)> {
        let l = &self.limits;
        let ms = [
            ("poll_ms", l.poll_ms),
            ("busy_wait_ms", l.busy_wait_ms),
            ("load_wait_ms", l.load_wait_ms),
            ("idle_grace_ms", l.idle_grace_ms),
            ("liveness_ms", l.liveness_ms),
            ("connect_ms", l.connect_ms),
            ("call_ms", l.call_ms),
        ];
        // A zero read timeout means "block forever" to std, the opposite of what was asked.
        if let Some((key, _)) = ms.iter().find(|(_, v)| *v == 0) {
            return Err(("limits", key, "must be at least 1 ms".into()));
        }
        if l.thinking_cap == 0 {
            return Err(("limits", "thinking_cap", "must be at least 1 token".into()));
        }
        if l.max_tokens == 0 {
            return Err(("limits", "max_tokens", "must be at least 1 token".into()));
        }
        let r = &self.retry;
        if r.attempts == 0 {
            return Err(("retry", "attempts", "must be at least 1".into()));
        }
        if r.attempts > Retry::MAX_ATTEMPTS {
            let max = Retry::MAX_ATTEMPTS;
            return Err(("retry", "attempts", format!("must be at most {max}")));
        }
        if r.delays_ms.len() + 1 != r.attempts as usize {
            let (attempts, entries) = (r.attempts, r.delays_ms.len());
            return Err((
                "retry",
                "delays_ms",
                format!(
                    "has {entries} entries and must have one fewer than retry.attempts \
                     ({attempts}); leave it out to take the default schedule's first {}",
                    attempts - 1
                ),
            ));
        }
        if r.jitter_percent > 100 {
            return Err(("retry", "jitter_percent", "must be at most 100".into()));
        }
        if self.model.is_empty() {
            return Err(("", "model", "must not be empty".into()));
        }
        let ss = &self.sessions;
        for (key, v) in [
            ("max_sessions", ss.max_sessions as u64),
            ("max_log_bytes", ss.max_log_bytes),
            ("summary_max_tokens", ss.summary_max_tokens),
        ] {
            if v == 0 {
                return Err(("sessions", key, "must be at least 1".into()));
            }
        }
        if let Some(e) = &self.expect {
            let h = &e.chat_template_sha256;
            // A placeholder (`"020aba33…"`) would only fail at the self-test, on a live server.
            if h.len() != SHA256_HEX_DIGITS || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
                let shown: String = h.chars().take(80).collect();
                return Err((
                    "expect",
                    "chat_template_sha256",
                    format!(
                        "`{shown}` is not a SHA-256 ({SHA256_HEX_DIGITS} hex digits): set the \
                         hash of the template the server serves (`loopd probe --socket S` \
                         prints it)"
                    ),
                ));
            }
        }
        self.runner
            .validate()
            .map_err(|(table, key, message)| (table, key, message.to_owned()))?;
        // With [[host]] the one plain host is not used: its KV directory would be ignored.
        if !self.host.is_empty() && self.runner.kv.dir.is_some() {
            return Err((
                "runner.kv",
                "dir",
                "names the KV directory of the one server of a config without [[host]]; \
                 with [[host]], set each host's `kv_dir` instead"
                    .to_owned(),
            ));
        }
        // One timeline (docs/runner.md): a silent generation is reported to the worker no
        // later than the client gives up on it. Left out, stall_ms is liveness_ms, so only a
        // stall_ms the file wrote can be past it.
        let (stall, liveness) = (self.runner.stall_ms, l.liveness_ms);
        if stall > liveness {
            return Err((
                "runner",
                "stall_ms",
                format!(
                    "{stall} is greater than limits.liveness_ms ({liveness}): the client would \
                     end the generation as stalled before the stall report was due; lower \
                     runner.stall_ms to at most {liveness} (or leave it out to follow \
                     limits.liveness_ms), or raise limits.liveness_ms to at least {stall}"
                ),
            ));
        }
        Ok(())
    }
}

/// Whether the file wrote `key` in `table` (dotted: `runner.loop_detector`).
fn is_written(written: &toml::Table, table: &str, key: &str) -> bool {
    let mut at = written;
    for name in table.split('.') {
        match at.get(name) {
            Some(toml::Value::Table(t)) => at = t,
            _ => return false,
        }
    }
    at.contains_key(key)
}

/// The line (1-based) of the `i`-th (0-based) `[[host]]` header; 1 if there is none.
fn nth_host_line(text: &str, i: usize) -> usize {
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.trim().trim_end_matches(|c: char| c != ']') == "[[host]]")
        .nth(i)
        .map_or(1, |(n, _)| n + 1)
}

/// `table.key`, or `key` at the top level.
fn join(table: &str, key: &str) -> String {
    if table.is_empty() {
        key.to_owned()
    } else {
        format!("{table}.{key}")
    }
}

/// The text between the backticks that follow `prefix` in `message`.
fn backticked_after(message: &str, prefix: &str) -> Option<String> {
    let rest = &message[message.find(prefix)? + prefix.len()..];
    let rest = rest.strip_prefix('`')?;
    Some(rest[..rest.find('`')?].to_owned())
}

/// The line (1-based) holding `offset` and the dotted key written on it.
fn key_at(text: &str, offset: usize) -> (usize, String) {
    let offset = offset.min(text.len());
    let line = text[..offset].matches('\n').count() + 1;
    let line_text = text.lines().nth(line - 1).unwrap_or("");
    let trimmed = line_text.trim();
    let key = if trimmed.starts_with('#') {
        String::new() // a comment sets no key
    } else if let Some(header) = trimmed.strip_prefix('[') {
        header.trim_end_matches(']').trim().to_owned()
    } else {
        let name = trimmed
            .split('=')
            .next()
            .unwrap_or("")
            .trim()
            .trim_matches('"');
        join(&table_before(text, offset), name)
    };
    (line, key)
}

/// What is at `offset` of `text`, for a refusal that came without words.
fn unexpected_at(text: &str, offset: usize) -> String {
    let column = text
        .get(line_start(text, offset)..offset)
        .map_or(1, |l| l.chars().count() + 1);
    match text.get(offset..).and_then(|rest| rest.chars().next()) {
        Some(c) => format!("unexpected character {c:?} at column {column}"),
        None => "unexpected end of the file".to_owned(),
    }
}

/// Byte offset where the line holding `offset` starts.
fn line_start(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())]
        .rfind('\n')
        .map_or(0, |i| i + 1)
}

/// The `[table]` header in force on the line before the one holding `offset`.
fn table_before(text: &str, offset: usize) -> String {
    let head = &text[..line_start(text, offset)];
    head.lines()
        .filter_map(|l| l.trim().strip_prefix('['))
        .next_back()
        .map_or_else(String::new, |h| h.trim_end_matches(']').trim().to_owned())
}

/// The line (1-based) where `key` is set inside `[table]`; 1 if it is not written (a default).
fn line_of(text: &str, table: &str, key: &str) -> usize {
    let mut current = String::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if let Some(h) = t.strip_prefix('[') {
            current = h.trim_end_matches(']').trim().to_owned();
        } else if current == table && t.split('=').next().map(str::trim) == Some(key) {
            return i + 1;
        }
    }
    1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("/etc/loopd/config.toml"), text)
    }

    const MINIMAL: &str = "socket = \"/run/infer.sock\"\nmodel = \"m\"\n";

    const HOSTS: &str = "placement = \"round_robin\"\n\
        [expect]\nchat_template_sha256 = \"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\"\n\
        n_ctx = 8192\ntotal_slots = 2\n\
        [[host]]\nname = \"gpu-a\"\ninfer_socket = \"/run/loopd/gpu-a/infer.sock\"\n\
        worker_socket = \"/run/loopd/gpu-a/status.sock\"\nslots = [0, 1]\n\
        [[host]]\nname = \"gpu-b\"\ninfer_socket = \"/run/loopd/gpu-b/infer.sock\"\n\
        worker_socket = \"/run/loopd/gpu-b/status.sock\"\nslots = [1]\n";

    #[test]
    fn hosts_and_placement_are_read_and_checked_against_total_slots() {
        let c = parse(&format!("{MINIMAL}{HOSTS}")).unwrap();
        assert_eq!(c.placement, PlacementPolicy::RoundRobin);
        let fleet = c.fleet().expect("two hosts");
        let names: Vec<(&str, &[u32])> = fleet
            .hosts()
            .iter()
            .map(|h| (h.name.as_str(), h.slots.as_slice()))
            .collect();
        assert_eq!(names, [("gpu-a", &[0, 1][..]), ("gpu-b", &[1][..])]);
        assert_eq!(
            fleet.hosts()[1].worker_socket,
            Path::new("/run/loopd/gpu-b/status.sock")
        );
        // Without [[host]], no fleet: `socket` and `runner.worker_socket` are the one host.
        let one = parse(MINIMAL).unwrap();
        assert!(one.fleet().is_none());
        assert_eq!(one.placement, PlacementPolicy::Affinity);
        // A slot the server does not have names the host's line and key.
        let bad = format!("{MINIMAL}{}", HOSTS.replace("slots = [1]", "slots = [2]"));
        let e = parse(&bad).unwrap_err();
        assert_eq!(e.key, "host[1].slots");
        // The line of the host's `[[host]]` header.
        assert_eq!(e.line, 13, "{e}");
        assert_eq!(
            e.to_string(),
            "/etc/loopd/config.toml:13: key `host[1].slots`: slot 2 does not exist: the server \
             has 2 (expect.total_slots)"
        );
        let twice = format!("{MINIMAL}{}", HOSTS.replace("gpu-b\"", "gpu-a\""));
        assert_eq!(parse(&twice).unwrap_err().key, "host[1].name");
        let unknown = format!("{MINIMAL}{HOSTS}weight = 2\n");
        assert!(parse(&unknown).is_err());
        // A host's KV directory is its own; the plain one is refused beside [[host]].
        let kv = format!("{MINIMAL}{HOSTS}kv_dir = \"/var/lib/llama/kv\"\n");
        let fleet = parse(&kv).unwrap();
        let hosts = fleet.fleet().unwrap();
        assert_eq!(hosts.hosts()[0].kv_dir, None);
        assert_eq!(
            hosts.hosts()[1].kv_dir.as_deref(),
            Some(Path::new("/var/lib/llama/kv"))
        );
        let plain = format!("{MINIMAL}{HOSTS}[runner.kv]\ndir = \"/kv\"\n");
        assert_eq!(parse(&plain).unwrap_err().key, "runner.kv.dir");
    }

    #[test]
    fn defaults_are_the_numbers_of_section_4() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c, Config::new("/run/infer.sock", "m"));
        let l = c.limits;
        assert_eq!(
            [
                l.poll_ms,
                l.busy_wait_ms,
                l.load_wait_ms,
                l.idle_grace_ms,
                l.liveness_ms
            ],
            [5_000, 600_000, 180_000, 30_000, 30_000]
        );
        assert_eq!([l.connect_ms, l.call_ms], [5_000, 30_000]);
        assert_eq!(
            [l.thinking_cap, l.thinking_overrun, l.max_tokens],
            [4_096, 256, 8_192]
        );
        assert_eq!(l.queue, 8);
        assert_eq!(c.retry.attempts, 4);
        assert_eq!(c.retry.delays_ms, [2_000, 8_000, 30_000]);
        assert_eq!((c.retry.jitter_percent, c.retry.total_ms), (25, 300_000));
    }

    #[test]
    fn the_daemons_store_and_its_sync_parse_and_a_bad_sync_is_refused() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.daemon.store, None);
        assert_eq!(c.daemon.store_sync, crate::daemon::Durability::Normal);
        let c = parse(&format!(
            "{MINIMAL}[daemon]\nstore = \"/var/lib/loopd/x.db\"\nstore_sync = \"full\"\n"
        ))
        .unwrap();
        assert_eq!(
            c.daemon.store.as_deref(),
            Some(Path::new("/var/lib/loopd/x.db"))
        );
        assert_eq!(c.daemon.store_sync, crate::daemon::Durability::Full);
        assert!(parse(&format!("{MINIMAL}[daemon]\nstore_sync = \"off\"\n")).is_err());
    }

    #[test]
    fn every_section_parses() {
        let text = format!(
            "{MINIMAL}[limits]\npoll_ms = 50\nqueue = 2\n[retry]\nattempts = 2\ndelays_ms = [10]\n\
             [sampling]\ntemperature = 0.5\ntop_k = 40\nseed = 7\n\
             [expect]\nchat_template_sha256 = \"{HASH}\"\nn_ctx = 4096\ntotal_slots = 2\n"
        );
        let c = parse(&text).unwrap();
        assert_eq!(
            (c.limits.poll_ms, c.limits.queue, c.limits.liveness_ms),
            (50, 2, 30_000)
        );
        assert_eq!(
            (c.retry.attempts, c.retry.delays_ms.as_slice()),
            (2, &[10][..])
        );
        assert_eq!(c.sampling.temperature, Some(0.5));
        assert_eq!(
            (c.sampling.top_k, c.sampling.seed, c.sampling.top_p),
            (Some(40), Some(7), None)
        );
        let e = c.expect.unwrap();
        assert_eq!(
            (e.chat_template_sha256.as_str(), e.n_ctx, e.total_slots),
            (HASH, 4096, 2)
        );
    }

    /// 64 hex digits: the rule checks the form, the self-test the value.
    const HASH: &str = "bd1a4e8b6fcd45ee1b5c64bd1e1d6b8e3a1a6c2f2f0ddf2e8ad0f0b4b9e0c1a2";

    #[test]
    fn a_placeholder_template_hash_is_refused_with_its_line() {
        let expect = |h: &str| {
            format!(
                "{MINIMAL}[expect]\nchat_template_sha256 = \"{h}\"\nn_ctx = 1\ntotal_slots = 1\n"
            )
        };
        assert_eq!(HASH.len(), SHA256_HEX_DIGITS);
        assert!(parse(&expect(HASH)).is_ok());
        assert!(parse(&expect(&HASH.to_ascii_uppercase())).is_ok());
        for bad in [
            "020aba33\u{2026}",
            &HASH[1..],
            &format!("{HASH}0"),
            &format!("{}g", &HASH[1..]),
            "",
        ] {
            let e = parse(&expect(bad)).unwrap_err();
            assert_eq!(
                (e.line, e.key.as_str()),
                (4, "expect.chat_template_sha256"),
                "{bad}"
            );
            assert_eq!(
                e.message,
                format!(
                    "`{bad}` is not a SHA-256 (64 hex digits): set the hash of the template the \
                     server serves (`loopd probe --socket S` prints it)"
                )
            );
        }
    }

    #[test]
    fn unknown_key_names_file_line_and_key() {
        let e = parse(&format!("{MINIMAL}[limits]\npoll_ms = 5\npoll_msec = 5\n")).unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (5, "limits.poll_msec"));
        assert!(e
            .to_string()
            .starts_with("/etc/loopd/config.toml:5: key `limits.poll_msec`: "));
        let e = parse(&format!("{MINIMAL}sockets = \"x\"\n")).unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (3, "sockets"));
    }

    #[test]
    fn a_control_character_in_a_comment_is_named_with_its_line_and_no_key() {
        let e = parse(&format!("{MINIMAL}[daemon]\n# store = \"a\u{1}b\"\n")).unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (4, ""));
        assert_eq!(e.message, "unexpected character '\\u{1}' at column 13");
    }

    #[test]
    fn unknown_table_is_an_error() {
        let e = parse(&format!("{MINIMAL}[limit]\npoll_ms = 5\n")).unwrap_err();
        assert_eq!(e.key, "limit");
        assert_eq!(e.line, 3);
    }

    #[test]
    fn wrong_type_names_the_key() {
        let e = parse(&format!("{MINIMAL}\n[limits]\nliveness_ms = \"30s\"\n")).unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (5, "limits.liveness_ms"));
    }

    #[test]
    fn missing_required_key_is_named() {
        let e = parse("model = \"m\"\n").unwrap_err();
        assert_eq!(e.key, "socket");
        let e = parse(&format!("{MINIMAL}[expect]\nn_ctx = 1\ntotal_slots = 1\n")).unwrap_err();
        assert_eq!(e.key, "expect.chat_template_sha256");
    }

    #[test]
    fn zero_timer_is_refused_with_its_line() {
        let e = parse(&format!(
            "{MINIMAL}[limits]\nqueue = 3\nidle_grace_ms = 0\n"
        ))
        .unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (5, "limits.idle_grace_ms"));
        assert_eq!(e.message, "must be at least 1 ms");
    }

    #[test]
    fn retry_schedule_must_match_attempts() {
        let e = parse(&format!(
            "{MINIMAL}[retry]\nattempts = 3\ndelays_ms = [1]\n"
        ))
        .unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (5, "retry.delays_ms"));
        assert_eq!(
            e.message,
            "has 1 entries and must have one fewer than retry.attempts (3); leave it out to \
             take the default schedule's first 2"
        );
        assert!(parse(&format!(
            "{MINIMAL}[retry]\nattempts = 3\ndelays_ms = [1, 2]\n"
        ))
        .is_ok());
        let e = parse(&format!("{MINIMAL}[retry]\njitter_percent = 101\n")).unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (4, "retry.jitter_percent"));
        assert!(parse(&format!("{MINIMAL}[retry]\njitter_percent = 100\n")).is_ok());
    }

    #[test]
    fn delays_left_out_follow_attempts() {
        let delays = |attempts: u32| {
            parse(&format!("{MINIMAL}[retry]\nattempts = {attempts}\n"))
                .unwrap()
                .retry
                .delays_ms
        };
        assert_eq!(delays(1), [0u64; 0]);
        assert_eq!(delays(3), [2_000, 8_000]);
        assert_eq!(delays(4), [2_000, 8_000, 30_000]);
        assert_eq!(delays(6), [2_000, 8_000, 30_000, 30_000, 30_000]);
        let at = delays(Retry::MAX_ATTEMPTS);
        assert_eq!((at.len(), at[98]), (99, 30_000));
        let e = parse(&format!("{MINIMAL}[retry]\nattempts = 101\n")).unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (4, "retry.attempts"));
        assert_eq!(e.message, "must be at most 100");
        let e = parse(&format!("{MINIMAL}[retry]\nattempts = 0\n")).unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.message.as_str()),
            ("retry.attempts", "must be at least 1")
        );
    }

    #[test]
    fn unreadable_file_names_the_path() {
        let e = Config::load(Path::new("/nonexistent/loopd.toml")).unwrap_err();
        assert!(e
            .to_string()
            .starts_with("/nonexistent/loopd.toml:1: cannot read: "));
    }
}
