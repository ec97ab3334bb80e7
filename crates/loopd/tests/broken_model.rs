//! A model that cannot load: the whole local stack (llama-worker, the router, inferproxy) over a model that
//! cannot load, with the default settings: `loopd selftest` does not wait out
//! `limits.load_wait_ms` (3 minutes) but exits non-zero within a minute of the stack starting,
//! its last line naming the cause the worker found.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use llama_harness::{temp_dir, workspace_root, LocalServer, Proxy, MODEL_ID};

const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The cached model (filled by `make llama`).
fn model() -> PathBuf {
    let out = Command::new(workspace_root().join("scripts/llama-server.sh"))
        .arg("model")
        .output()
        .expect("scripts/llama-server.sh model");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()).join(MODEL_FILE)
}

#[test]
fn selftest_over_a_model_that_cannot_load_names_the_cause_within_a_minute() {
    let dir = temp_dir("broken-model");
    // The GGUF header reads; the tensor data is cut off, so the instance exits on load.
    let bytes = std::fs::read(model()).unwrap();
    let cut = dir.join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 4]).unwrap();
    let started = Instant::now();
    let server = LocalServer::start_serving(&cut);
    let proxy = Proxy::start(server.addr());
    let config = dir.join("loopd.toml");
    std::fs::write(
        &config,
        format!(
            "socket = {:?}\nmodel = {MODEL_ID:?}\n\n[expect]\nchat_template_sha256 = \"{}\"\n\
             n_ctx = 4096\ntotal_slots = 2\n\n[runner]\nworker_socket = {:?}\n",
            proxy.socket(),
            "0".repeat(64),
            server.status_socket()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_loopd"))
        .args(["selftest", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let end = started + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "loopd selftest still waiting after 120 s; worker: {:?}",
                server.worker_status()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let took = started.elapsed();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(
            "loopd selftest: llama-worker is failed: crash-loop protection: 6 failures in a row \
             (5 restarts) without 600 s ready, the last because model smollm2 failed to load: \
             its instance exited with status "
        ),
        "{err}"
    );
    assert!(
        last.ends_with(&format!(
            "server log: the worker's own stderr (`llama-worker status --socket {}`)",
            server.status_socket().display()
        )),
        "{err}"
    );
    assert!(took < Duration::from_secs(60), "{took:?}: {err}");
    eprintln!("loopd selftest gave up after {took:?}: {last}");
    // With the worker failed, `ask` and `run` stop at once with the same reason.
    for cmd in ["ask", "run"] {
        let started = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_loopd"))
            .args([cmd, "--config"])
            .arg(&config)
            .arg("Why is the sky blue?")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let took = started.elapsed();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        let last = err.lines().last().unwrap_or_default();
        // `run` refuses as the daemon's submit does, with the seed's name first.
        let code = if cmd == "run" { "WORKER_FAILED: " } else { "" };
        assert!(
            last.starts_with(&format!(
                "loopd {cmd}: {code}llama-worker is failed: crash-loop protection: 6 failures"
            )),
            "{err}"
        );
        assert!(took < Duration::from_secs(10), "loopd {cmd} took {took:?}");
    }
    drop(proxy);
    drop(server);
    std::fs::remove_dir_all(&dir).unwrap();
}
