//! `scripts/llama-server.sh smoke BIN MODEL`, the check a new llama-server build must pass
//! before it is cached (a native build on a VM that advertises AMX crashed on the
//! first matmul). Stand-in binaries play each way a build can fail, and one that passes.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use llama_harness::{temp_dir, workspace_root};

/// Writes an executable stand-in for llama-server.
fn stand_in(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A stand-in server on the `--port` it is given: `/health` answers `health`, `/completion`
/// answers `completion` (a JSON body), both with 200.
fn http_stand_in(dir: &Path, name: &str, completion: &str) -> PathBuf {
    let script = format!(
        r#"#!/usr/bin/env python3
import http.server, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def reply(self, body):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self.reply(b'{{"status":"ok"}}')
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.reply({completion:?}.encode())
    def log_message(self, *a):
        print("stand-in:", self.path, flush=True)
print("stand-in listening on", port, flush=True)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"#
    );
    stand_in(dir, name, &script)
}

/// Runs the smoke check on `bin` with a bound on the whole run.
fn smoke(bin: &Path, timeout_s: u32) -> (Output, Duration) {
    let started = Instant::now();
    let out = Command::new(workspace_root().join("scripts/llama-server.sh"))
        .args(["smoke"])
        .arg(bin)
        .arg("/dev/null")
        .env("SMOKE_TIMEOUT", timeout_s.to_string())
        .output()
        .unwrap();
    (out, started.elapsed())
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_binary_that_crashes_on_load_fails_the_smoke_run_with_its_status_and_output() {
    let dir = temp_dir("smoke-crash");
    let bin = stand_in(
        &dir,
        "llama-server",
        "#!/bin/sh\necho 'load_tensors: CPU model buffer size = 87.73 MiB'\n\
         echo 'ggml_backend_amx_mul_mat: general protection fault' >&2\nexit 139\n",
    );
    let (out, took) = smoke(&bin, 30);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "llama-server.sh: smoke run FAILED at step 'load the model': llama-server exited \
             with status 139\n"
        ),
        "{err}"
    );
    assert!(
        err.contains("  | load_tensors: CPU model buffer size = 87.73 MiB\n"),
        "{err}"
    );
    assert!(
        err.contains("  | ggml_backend_amx_mul_mat: general protection fault\n"),
        "{err}"
    );
    assert!(took < Duration::from_secs(20), "{took:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_binary_that_never_answers_fails_at_the_step_deadline() {
    let dir = temp_dir("smoke-silent");
    let bin = stand_in(
        &dir,
        "llama-server",
        "#!/bin/sh\necho loading\nexec sleep 300\n",
    );
    let (out, took) = smoke(&bin, 1);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("smoke run FAILED at step 'load the model': no 200 from /health within 1 s"),
        "{err}"
    );
    assert!(err.contains("  | loading\n"), "{err}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_binary_that_loads_but_generates_nothing_fails_at_generation() {
    let dir = temp_dir("smoke-empty");
    let bin = http_stand_in(
        &dir,
        "llama-server",
        r#"{"content":"","tokens_predicted":0}"#,
    );
    let (out, _) = smoke(&bin, 30);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("smoke run FAILED at step 'generate 8 tokens': no tokens generated"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_binary_that_loads_and_generates_passes() {
    let dir = temp_dir("smoke-pass");
    let bin = http_stand_in(
        &dir,
        "llama-server",
        r#"{"content":" Paris.","tokens_predicted":8}"#,
    );
    let (out, _) = smoke(&bin, 30);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("smoke run passed: ") && err.contains("generated 8 tokens: ' Paris.'"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
