//! `loopd serve` on the real local stack (llama-worker, llama-server, inferproxy), driven by
//! the real `loopd submit` and `loopd result`: a two-iteration tool request on a budget of two
//! completes, and its result shows each call with its result and the budget down by one per
//! iteration.
//!
//! As in `runner_real_server.rs`, greedy sampling with a seed and a small `max_tokens` keep the
//! tiny model's answers the same from run to run, and a worked example (`--history`) gets it to
//! call the tool. The request offers only `read_file`, over a folder where `start.txt` says to
//! read `step2.txt`, which holds the number: the model reads one, then the other, then answers.
//! The example carries the budget notes the runner adds to tool results, so that the model
//! answers once the budget is spent instead of calling a third time; the call-only examples
//! after it keep its first move a call (SmolLM2-135M copies whatever came last).

mod real_serve;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use llama_harness::{LocalServer, Proxy};
use real_serve::{start_serve, write_config};
use serde_json::{json, Value};

const PROMPT: &str = "Read the file start.txt.";

/// One worked example of a file that points to another (with the runner's budget notes), then
/// two single reads.
fn history() -> Value {
    let call = |i: u32, path: &str| {
        json!({"role": "assistant", "content": "", "tool_calls": [{"id": format!("call_{i}"),
               "name": "read_file", "arguments": json!({"path": path}).to_string()}]})
    };
    let result = |i: u32, v: &str| json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": v});
    let user = |c: &str| json!({"role": "user", "content": c});
    json!([
        user("Read the file a.txt."),
        call(1, "a.txt"),
        result(1, "Read the file b.txt.\n[Tool iterations left: 1 of 2.]"),
        call(2, "b.txt"),
        result(
            2,
            "The number is 7.\n[Tool iterations left: 0 of 2. Do not call tools any more; answer now.]"
        ),
        {"role": "assistant", "content": "The number is 7."},
        user("Read the file notes.txt."),
        call(3, "notes.txt"),
        user("Read the file list.txt."),
        call(4, "list.txt"),
    ])
}

fn loopd(args: &[&str], config: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_loopd"))
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .unwrap()
}

#[test]
fn a_two_iteration_read_file_request_through_loopd_submit_and_loopd_result() {
    let server = LocalServer::start();
    let proxy = Proxy::start(server.addr());
    let dir = llama_harness::temp_dir("loopd-daemon-real");
    let (config, _socket) = write_config(
        &dir,
        &server,
        &proxy,
        "poll_ms = 500\nliveness_ms = 300000\nmax_tokens = 48",
        "budget = 2\nstall_ms = 300000",
    );
    // The folder read_file reads under: one file that points to the other.
    let folder = dir.join("folder");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("start.txt"), "Read the file step2.txt.\n").unwrap();
    std::fs::write(folder.join("step2.txt"), "The number is 391.\n").unwrap();
    let (mut serve, log) = start_serve(&config, &folder, &dir);

    let started = Instant::now();
    let history_file = dir.join("history.json");
    std::fs::write(&history_file, history().to_string()).unwrap();
    let out = loopd(
        &[
            "submit",
            "--budget",
            "2",
            "--tool",
            "read_file",
            "--system",
            "You answer every question by calling a tool.",
            "--history",
            history_file.to_str().unwrap(),
            PROMPT,
        ],
        &config,
    );
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        out.status.success(),
        "loopd submit: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = stdout
        .strip_prefix("req-")
        .unwrap_or_else(|| panic!("loopd submit printed {stdout:?}"));
    let out = loopd(&["result", "--wait", "1800", "--json", id], &config);
    let text = String::from_utf8_lossy(&out.stdout);
    let reply: Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("loopd result --json: {e}: {text}"));
    let r = &reply["result"];
    eprintln!(
        "daemon real server: {:.1} s; outcome {} {}; calls {}; content {}",
        started.elapsed().as_secs_f64(),
        r["outcome"],
        r["detail"],
        r["tool_calls"],
        r["content"]
    );
    assert_eq!(r["outcome"], "completed", "{r:#}");
    assert!(out.status.success(), "{r:#}");
    // Two iterations, one call each, each with its result, each costing one of the budget;
    // then the answer from what the second read.
    let calls = r["tool_calls"].as_array().unwrap();
    let seen: Vec<(u64, Value, &str)> = calls
        .iter()
        .map(|c| {
            assert_eq!(c["name"], "read_file", "{r:#}");
            assert_eq!(c["ok"], true, "{r:#}");
            let args = serde_json::from_str(c["arguments"].as_str().unwrap_or("")).unwrap();
            (
                c["iteration"].as_u64().unwrap(),
                args,
                c["result"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (
                1,
                json!({"path": "start.txt"}),
                "Read the file step2.txt.\n"
            ),
            (2, json!({"path": "step2.txt"}), "The number is 391.\n"),
        ],
        "{r:#}"
    );
    assert_eq!(r["budget_left"].as_u64(), Some(0), "{r:#}");
    let budgets: Vec<u64> = r["generations"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|g| g["budget_left"].as_u64())
        .collect();
    assert_eq!(budgets, [2, 1, 0], "{r:#}");
    assert!(r["content"].as_str().unwrap_or("").contains("391"), "{r:#}");

    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(serve.0.id().to_string())
        .status();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = serve.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "loopd serve did not stop within 60 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        status.code(),
        Some(0),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
