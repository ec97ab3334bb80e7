//! `loopd serve` on the real local stack (llama-worker, llama-server, inferproxy), driven by
//! the real `loopd submit` and `loopd result`: a tool request on a budget of two completes,
//! and its result shows each call with its result and the budget down by one per iteration.
//!
//! As in `runner_real_server.rs`, greedy sampling with a seed and a small `max_tokens` keep the
//! tiny model's answers the same from run to run, and worked examples (`--history`: earlier
//! turns with their calls and results) get it to call the tool; the request offers only
//! `arithmetic`. SmolLM2 copies the first call of the examples but answers after its result
//! instead of making the second: the test asserts the bookkeeping of however many iterations
//! it used (one, today), not two.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use llama_harness::{LocalServer, Proxy};
use loopd::config::Config;
use loopd::llama::Client;
use loopd::selftest::SAMPLING;
use serde_json::{json, Value};

const PROMPT: &str = "Multiply 17 by 23, then add 5.";

/// Three worked examples, each a multiplication then an addition, with the calls and results.
fn history() -> Value {
    let call = |i: u32, op: &str, a: u32, b: u32| {
        json!({"role": "assistant", "content": "", "tool_calls": [{"id": format!("call_{i}"),
               "name": "arithmetic",
               "arguments": json!({"operation": op, "numbers": [a, b]}).to_string()}]})
    };
    let result = |i: u32, v: u32| json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": v.to_string()});
    let mut m = Vec::new();
    for (k, (a, b, c)) in [(2, 4, 1), (3, 5, 2), (6, 2, 7)].into_iter().enumerate() {
        let i = 2 * k as u32 + 1;
        m.push(json!({"role": "user", "content": format!("Multiply {a} by {b}, then add {c}.")}));
        m.extend([call(i, "multiply", a, b), result(i, a * b)]);
        m.extend([call(i + 1, "add", a * b, c), result(i + 1, a * b + c)]);
        m.push(json!({"role": "assistant", "content": (a * b + c).to_string()}));
    }
    Value::Array(m)
}

struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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
fn a_tool_request_on_a_budget_through_loopd_submit_and_loopd_result() {
    let server = LocalServer::start();
    let proxy = Proxy::start(server.addr());
    let props = Client::new(Config::new(proxy.socket(), server.model()))
        .props()
        .expect("GET /props through inferproxy");
    let dir = llama_harness::temp_dir("loopd-daemon-real");
    let socket = dir.join("loopd.sock");
    let config = dir.join("loopd.toml");
    std::fs::write(
        &config,
        format!(
            "socket = {:?}\nmodel = {:?}\n\
             [limits]\npoll_ms = 500\nliveness_ms = 300000\nmax_tokens = 48\n\
             [sampling]\ntemperature = 0.0\nseed = {}\n\
             [runner]\nbudget = 2\nworker_socket = {:?}\nstall_ms = 300000\n\
             [daemon]\nsocket = {:?}\n\
             [expect]\nchat_template_sha256 = \"{}\"\nn_ctx = {}\ntotal_slots = {}\n",
            proxy.socket().display().to_string(),
            server.model(),
            SAMPLING.seed.unwrap(),
            server.status_socket().display().to_string(),
            socket.display().to_string(),
            llama_proto::hash::sha256(props.chat_template.as_bytes()).unwrap(),
            props.n_ctx,
            props.total_slots,
        ),
    )
    .unwrap();
    let notify_path = dir.join("notify.sock");
    let log = dir.join("serve.log");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    let mut serve = Serve(
        Command::new(env!("CARGO_BIN_EXE_loopd"))
            .args(["serve", "--config"])
            .arg(&config)
            .env("NOTIFY_SOCKET", &notify_path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    // The self-test runs three generations first: minutes on a loaded 2-core box.
    notify
        .set_read_timeout(Some(Duration::from_secs(900)))
        .unwrap();
    let mut buf = [0u8; 256];
    let ready = notify
        .recv(&mut buf)
        .map(|n| String::from_utf8_lossy(&buf[..n]).trim_end().to_owned());
    if !matches!(ready.as_deref(), Ok("READY=1")) {
        let _ = serve.0.kill();
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        panic!("loopd serve never said READY=1 ({ready:?}); it said:\n{said}");
    }

    let started = Instant::now();
    let history_file = dir.join("history.json");
    std::fs::write(&history_file, history().to_string()).unwrap();
    let out = loopd(
        &[
            "submit",
            "--budget",
            "2",
            "--tool",
            "arithmetic",
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
    // Every iteration ran its calls, each with a result, and cost exactly one of the budget.
    let calls = r["tool_calls"].as_array().unwrap();
    assert!(!calls.is_empty(), "the model called no tool: {r:#}");
    let iterations = calls
        .iter()
        .filter_map(|c| c["iteration"].as_u64())
        .max()
        .unwrap();
    assert_eq!(r["budget_left"].as_u64(), Some(2 - iterations), "{r:#}");
    assert_eq!(
        r["generations"].as_array().map(Vec::len),
        Some(iterations as usize + 1),
        "{r:#}"
    );
    for c in calls {
        assert_eq!(c["name"], "arithmetic", "{r:#}");
        assert_eq!(c["ok"], true, "{r:#}");
        assert!(!c["result"].as_str().unwrap_or("").is_empty(), "{r:#}");
    }
    let first: Value = serde_json::from_str(calls[0]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(
        first,
        json!({"operation": "multiply", "numbers": [17, 23]}),
        "{r:#}"
    );
    assert!(
        calls[0]["result"].as_str().unwrap().starts_with("391"),
        "{r:#}"
    );

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
