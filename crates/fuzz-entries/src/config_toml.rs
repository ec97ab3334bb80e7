//! The two config files on any text: the first byte chooses loopd's (`loopd::Config::parse`,
//! even) or llama-worker's (`llama_worker::Config::from_toml`, odd); the rest is the file.
//!
//! Nothing panics, and a second parse reads the same. loopd: an accepted config holds every
//! rule its `validate` and `[[host]]` check hold (written here from the module docs, as they
//! are private), its text reads as a TOML table (which the defaults that follow another key
//! rely on), and each such default follows its key when the file left it out; a refusal names
//! the path given (another path, the same refusal but for the path), a line of the file and,
//! in its Display, the key. llama-worker: an accepted config passes its own `validate`, its
//! timings are in range, and the spawn line is made; a refusal's Display is its `config: `
//! line, and a TOML error's position is inside the file.

use std::path::Path;
use std::time::Duration;

use llama_worker::config::MAX_SECONDS;
use loopd_client::config::{Retry, SHA256_HEX_DIGITS};

/// The `config_toml` fuzz target: panics when a check fails.
pub fn config_toml(data: &[u8]) {
    let Some((&which, text)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(text);
    if which % 2 == 0 {
        loopd_config(&text);
    } else {
        worker_config(&text);
    }
}

/// The path every loopd parse names, and another for the second reading.
const PATH: &str = "/etc/loopd/config.toml";
const OTHER_PATH: &str = "relative/ünïcode dir/loopd.toml";

fn loopd_config(text: &str) {
    let got = loopd::Config::parse(Path::new(PATH), text);
    let other = loopd::Config::parse(Path::new(OTHER_PATH), text);
    match (&got, &other) {
        (Ok(a), Ok(b)) => {
            // Debug, not ==: an unchecked sampling value may be NaN.
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "a second reading");
            check_loopd(text, a);
        }
        (Err(a), Err(b)) => {
            assert_eq!(
                (a.line, &a.key, &a.message),
                (b.line, &b.key, &b.message),
                "the refusal depends on the path"
            );
            check_loopd_error(text, a, PATH);
            check_loopd_error(text, b, OTHER_PATH);
        }
        (a, b) => panic!("{PATH}: {a:?}; {OTHER_PATH}: {b:?}"),
    }
}

fn check_loopd(text: &str, c: &loopd::Config) {
    let l = &c.limits;
    for v in [
        l.poll_ms,
        l.busy_wait_ms,
        l.load_wait_ms,
        l.idle_grace_ms,
        l.liveness_ms,
        l.connect_ms,
        l.call_ms,
        l.thinking_cap,
        l.max_tokens,
    ] {
        assert!(v >= 1, "{l:?}");
    }
    let r = &c.retry;
    assert!((1..=Retry::MAX_ATTEMPTS).contains(&r.attempts), "{r:?}");
    assert_eq!(r.delays_ms.len() + 1, r.attempts as usize, "{r:?}");
    assert!(r.jitter_percent <= 100);
    assert!(!c.model.is_empty());
    if let Some(e) = &c.expect {
        let h = &e.chat_template_sha256;
        assert!(h.len() == SHA256_HEX_DIGITS && h.bytes().all(|b| b.is_ascii_hexdigit()));
    }
    assert_eq!(c.runner.validate(), Ok(()));
    assert!(c.runner.stall_ms <= l.liveness_ms);
    assert_eq!(c.fleet().is_some(), !c.host.is_empty(), "{:?}", c.host);
    let written: toml::Table = text
        .parse()
        .unwrap_or_else(|e| panic!("accepted, and not a TOML table: {e}"));
    let set = |table: &str, key: &str| {
        written
            .get(table)
            .and_then(|t| t.as_table())
            .is_some_and(|t| t.contains_key(key))
    };
    if !set("retry", "delays_ms") {
        assert_eq!(r.delays_ms, Retry::delays_for(r.attempts));
    }
    if !set("runner", "stall_ms") {
        assert_eq!(c.runner.stall_ms, l.liveness_ms);
    }
}

fn check_loopd_error(text: &str, e: &loopd::ConfigError, path: &str) {
    assert_eq!(e.path, Path::new(path));
    let shown = e.to_string();
    let head = format!("{path}:{}: ", e.line);
    assert!(
        shown.starts_with(&head),
        "{shown:?} does not start {head:?}"
    );
    assert!(shown.len() > head.len(), "{shown:?} says nothing");
    assert!(!e.message.is_empty(), "{shown:?}");
    if !e.key.is_empty() {
        assert!(shown.contains(&format!("key `{}`: ", e.key)), "{shown:?}");
    }
    let lines = text.matches('\n').count() + 1;
    assert!(
        (1..=lines).contains(&e.line),
        "line {} of a {lines}-line file: {shown}",
        e.line
    );
}

fn worker_config(text: &str) {
    let got = llama_worker::Config::from_toml(text);
    assert_eq!(
        got,
        llama_worker::Config::from_toml(text),
        "a second reading"
    );
    match got {
        Ok(c) => {
            assert_eq!(c.validate(), Ok(()));
            let t = c.timings().expect("a valid config has its timings");
            let week = Duration::from_secs_f64(MAX_SECONDS);
            let p = &t.policy;
            for d in [
                p.startup_deadline,
                p.unready_restart_after,
                p.stall_timeout,
                p.restart_window,
                t.startup_probe_interval,
                t.probe_interval,
                t.probe_timeout,
                t.cpu_probe_interval,
                t.metrics_interval,
            ] {
                assert!(!d.is_zero() && d <= week, "{t:?}");
            }
            assert!(p.restart_backoff <= week && t.stop_grace <= week);
            assert!(p.stall_timeout >= t.cpu_probe_interval * 2);
            assert!(p.max_restarts_per_window >= 1);
            assert!(c.readiness_paths.iter().all(|p| p.starts_with('/')));
            let spec = c.command_spec(8080);
            assert_eq!(spec.program, c.command);
            assert_eq!(
                (spec.args.len(), spec.env.len()),
                (c.args.len(), c.env.len())
            );
            let _ = c.validate_for_port(8080);
        }
        Err(e) => {
            let shown = e.to_string();
            assert!(
                shown.starts_with("config: ") && shown.len() > 8,
                "{shown:?}"
            );
            if let llama_worker::ConfigError::Toml(m) = &e {
                if let Some(line) = toml_line(m) {
                    let lines = text.matches('\n').count() + 1;
                    assert!((1..=lines).contains(&line), "line {line}: {m}");
                }
            }
        }
    }
}

/// The line of toml's `TOML parse error at line L, column C`.
fn toml_line(message: &str) -> Option<usize> {
    let at = "at line ";
    let rest = &message[message.find(at)? + at.len()..];
    rest[..rest.find(',')?].parse().ok()
}
