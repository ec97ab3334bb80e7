//! `loopd serve`: the start-up (load wait, self-test, socket, READY=1) and the signals around
//! the library's [`Daemon`].

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use loopd::daemon::{store_path, Daemon, Db, DbSettings, Settings};
use loopd_agent::fleet::PlacementConfig;
use loopd_agent::runner::{builtin_tools, HostSpec, Runner, RunnerConfig, StandardBios};
use loopd_client::llama::Client;
use loopd_client::selftest;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::exit::{Exit, Fail};

fn fail(e: String) -> Fail {
    Fail::new(Exit::Failed, e)
}

/// Whether a daemon answers on `socket`: a live one accepts; a stale file refuses (and is
/// replaced at bind), and no file is no daemon.
fn already_served(socket: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(socket).is_ok()
}

/// Runs the daemon until a stop signal; status 1 when it refused to start, 2 for a bad config.
pub fn serve(config: &Path, folder: Option<&Path>) -> Result<Exit, Fail> {
    let cfg = crate::check::load(config)?;
    let socket = crate::check::serve_needs(&cfg, config)?;
    // Before anything costs: a second daemon would run the whole self-test on the live server
    // only to fail at bind.
    if already_served(&socket) {
        return Err(fail(format!(
            "refusing to start: a loopd serve is already serving on {} (`loopd status --socket {}`)",
            socket.display(),
            socket.display()
        )));
    }
    // With `[[host]]` each host is reached (and tested) on its own below; without, the one
    // inference socket must answer before anything else.
    let fleet = cfg.fleet();
    let client = match fleet {
        Some(_) => Client::new(cfg.client()),
        None => crate::reach(&cfg)?,
    };
    // Opened first: a store another daemon holds (or that is corrupt, unwritable, newer)
    // refuses the start at once, before the wait for the model.
    let env = |k| std::env::var_os(k);
    let path = match store_path(
        cfg.daemon.store.as_deref(),
        env("STATE_DIRECTORY").as_deref(),
        env("XDG_STATE_HOME").as_deref(),
        env("HOME").as_deref(),
    ) {
        Ok(p) => p,
        Err(e) => return Err(fail(format!("refusing to start: {e}"))),
    };
    let db_settings = DbSettings {
        durability: cfg.daemon.store_sync,
        ttl: Duration::from_secs(cfg.runner.result_ttl_s),
        cap: cfg.runner.max_results,
    };
    let db = match Db::open(&path, db_settings) {
        Ok(db) => db,
        Err(e) => return Err(fail(format!("refusing to start: {e}"))),
    };
    let tools = match builtin_tools(folder, client.shared_clock()) {
        Ok(t) => t,
        Err(e) => return Err(fail(format!("--folder: {e}"))),
    };
    let hosts = match &fleet {
        None => {
            if let Err(e) = crate::wait_for_server(&client, &cfg.runner) {
                return Err(fail(format!("refusing to start: {e}")));
            }
            eprintln!(
                "loopd serve: self-test on socket {}, model {}, slot 0",
                cfg.socket.display(),
                cfg.model
            );
            let checks = selftest::run(&client, 0, &mut |c| eprintln!("{c}"));
            if let Some(bad) = checks.iter().find(|c| !c.passed) {
                return Err(fail(format!(
                    "refusing to start: the self-test failed: {bad}"
                )));
            }
            None
        }
        Some(fleet) => {
            let specs: Vec<HostSpec> = fleet.hosts().iter().map(HostSpec::from).collect();
            let passed = test_hosts(&client, &cfg.runner, &specs);
            if passed.is_empty() {
                return Err(fail(format!(
                    "refusing to start: none of the {} hosts passed its self-test",
                    specs.len()
                )));
            }
            Some(passed)
        }
    };
    let slots = match (&hosts, cfg.runner.slots) {
        (Some(h), _) => h.iter().map(|h| h.slots.len() as u32).sum(),
        (None, 0) => match client.props() {
            Ok(p) => p.total_slots,
            Err(e) => {
                return Err(fail(format!(
                    "refusing to start: GET /props for total_slots: {e}"
                )))
            }
        },
        (None, n) => n,
    };
    let names: Vec<String> = tools.schemas().into_iter().map(|s| s.name).collect();
    // The daemon runs on the client's clock: one clock for the runner, the store and the
    // sockets' deadlines.
    let clock = client.shared_clock();
    let bios = Arc::new(StandardBios);
    let runner = match hosts {
        None => Runner::new(Arc::new(client), cfg.runner.clone(), tools, bios, slots),
        Some(specs) => {
            let placement = PlacementConfig {
                policy: cfg.placement,
                ..PlacementConfig::default()
            };
            match Runner::with_hosts(
                Arc::new(client),
                cfg.runner.clone(),
                tools,
                bios,
                specs,
                placement,
            ) {
                Ok(r) => r,
                Err(e) => return Err(fail(format!("refusing to start: {}: {e}", e.key()))),
            }
        }
    };
    let signals = match Signals::new([SIGTERM, SIGINT]) {
        Ok(s) => s,
        Err(e) => return Err(fail(format!("cannot install signal handlers: {e}"))),
    };
    let bound = match socket_file::bind(&socket) {
        Ok(b) => b,
        Err(e) => return Err(fail(format!("socket {}: {e}", socket.display()))),
    };
    let listener = match bound.listener.try_clone() {
        Ok(l) => l,
        Err(e) => {
            bound.remove_file();
            return Err(fail(format!("socket {}: {e}", socket.display())));
        }
    };
    let settings = Settings {
        tools: names,
        budget: cfg.runner.budget,
        metrics_file: cfg.daemon.metrics_file.clone(),
        metrics_every: Duration::from_secs(1),
        // A cancel takes effect within one poll interval of the request's driver.
        shutdown_wait: Duration::from_millis(cfg.limits.poll_ms.saturating_mul(2) + 1_000),
        sessions: cfg.sessions,
        // The self-test held the server to `[expect]`, so its figures are the server's.
        n_ctx: cfg.expect.as_ref().map_or(0, |e| e.n_ctx),
        max_tokens: cfg.limits.max_tokens,
        template: cfg.expect.as_ref().map_or(String::new(), |e| {
            e.chat_template_sha256.to_ascii_lowercase()
        }),
    };
    let daemon = match Daemon::new(runner, clock, settings, db) {
        Ok(d) => d,
        Err(e) => {
            bound.remove_file();
            return Err(fail(format!(
                "refusing to start: store {}: {e}",
                path.display()
            )));
        }
    };
    let d = daemon.clone();
    let mut signals = signals;
    let watcher = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                let name = if sig == SIGTERM { "SIGTERM" } else { "SIGINT" };
                if d.stopping() {
                    eprintln!("loopd serve: {name} again: exiting now");
                    std::process::exit(130);
                }
                eprintln!(
                    "loopd serve: {name}: stopping (cancelling what runs; another signal exits at once)"
                );
                // systemd hears of the stop when it starts, not when the shutdown is over.
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
                d.stop();
            }
        });
    if let Err(e) = watcher {
        bound.remove_file();
        return Err(fail(format!("cannot start the signal thread: {e}")));
    }
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
    let linked = match &fleet {
        Some(_) => {
            let names: Vec<String> = daemon.hosts().into_iter().map(|h| h.name).collect();
            format!("hosts {}", names.join(", "))
        }
        None => format!(
            "worker socket {}",
            cfg.runner
                .worker_socket
                .as_deref()
                .map_or("none: not linked to llama-worker".into(), |p| p
                    .display()
                    .to_string())
        ),
    };
    eprintln!(
        "loopd serve: ready on {} ({slots} slots, store {}, {linked})",
        socket.display(),
        path.display(),
    );
    let served = daemon.serve(listener);
    bound.remove_file();
    match served {
        Ok(()) => {
            eprintln!("loopd serve: stopped");
            Ok(Exit::Completed)
        }
        Err(e) => Err(fail(format!("socket {}: {e}", socket.display()))),
    }
}

/// Each host's start-up check, all at once: its server answers `/props` within the load wait
/// and passes the self-test (the same `[expect]`) on its first owned slot. The hosts that
/// pass, in config order; each that fails is named with why, and not used.
fn test_hosts(base: &Client, settings: &RunnerConfig, specs: &[HostSpec]) -> Vec<HostSpec> {
    let results: Vec<Result<(), String>> = std::thread::scope(|scope| {
        let runs: Vec<_> = specs
            .iter()
            .map(|spec| scope.spawn(move || test_host(base, settings, spec)))
            .collect();
        runs.into_iter()
            .map(|r| {
                r.join()
                    .unwrap_or_else(|_| Err("its check panicked".into()))
            })
            .collect()
    });
    specs
        .iter()
        .zip(results)
        .filter_map(|(spec, r)| match r {
            Ok(()) => {
                eprintln!("loopd serve: host {}: self-test passed", spec.name);
                Some(spec.clone())
            }
            Err(e) => {
                eprintln!("loopd serve: host {}: not used: {e}", spec.name);
                None
            }
        })
        .collect()
}

fn test_host(base: &Client, settings: &RunnerConfig, spec: &HostSpec) -> Result<(), String> {
    let client = spec.client(base);
    let settings = RunnerConfig {
        worker_socket: spec.worker_socket.clone(),
        ..settings.clone()
    };
    crate::wait_for_server(&client, &settings)?;
    let slot = spec.slots.first().copied().unwrap_or(0);
    let checks = selftest::run(&client, slot, &mut |c| {
        eprintln!("loopd serve: host {}: {c}", spec.name)
    });
    match checks.iter().find(|c| !c.passed) {
        Some(bad) => Err(format!("the self-test failed: {bad}")),
        None => Ok(()),
    }
}
