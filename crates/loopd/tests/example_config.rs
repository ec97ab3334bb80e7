//! docs/loopd.example.toml as shipped: it parses through loopd's own config path, names the
//! sockets the units create (inferproxy's --listen, llama-worker's --socket, loopd's
//! RuntimeDirectory), the shared metrics folder, and an [expect] that matches the template and
//! the preset docs/production.md installs. `make install-check` runs it for real; this is the
//! quick half; `loopd check-config` takes it as shipped.

use std::path::{Path, PathBuf};

use llama_proto::hash::sha256;
use loopd::Config;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The value after `flag` on the unit's ExecStart= line (the units quote nothing).
fn exec_flag(unit: &str, flag: &str) -> PathBuf {
    let text = read(unit);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .unwrap_or_else(|| panic!("{unit}: no ExecStart="));
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == flag).unwrap();
    PathBuf::from(words[at + 1])
}

/// `key = value` in the preset's model section.
fn preset(key: &str) -> String {
    let text = read("docs/llama-server.preset.ini");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key} = ")))
        .unwrap_or_else(|| panic!("preset: no {key}"))
        .to_owned()
}

#[test]
fn the_example_parses_and_names_the_units_sockets() {
    let path = repo("docs/loopd.example.toml");
    let cfg = Config::load(&path).unwrap();
    assert_eq!(
        cfg.socket,
        exec_flag("docs/inferproxy.service", "--listen"),
        "socket is inferproxy's --listen"
    );
    assert_eq!(
        cfg.runner.worker_socket,
        Some(exec_flag("docs/llama-worker.service", "--socket")),
        "runner.worker_socket is llama-worker's --socket"
    );
    assert_eq!(
        exec_flag("docs/loopd.service", "--config"),
        Path::new("/etc/loopd/loopd.toml")
    );
    // RuntimeDirectory=loopd is /run/loopd.
    assert_eq!(
        cfg.daemon.socket.as_deref(),
        Some(Path::new("/run/loopd/loopd.sock"))
    );
    assert!(read("docs/loopd.service").contains("\nRuntimeDirectory=loopd\n"));
    let metrics = cfg.daemon.metrics_file.unwrap();
    let tmpfiles = read("docs/boxmaker.tmpfiles.conf");
    let folder = tmpfiles
        .lines()
        .find(|l| l.starts_with("d "))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap();
    assert_eq!(metrics.parent(), Some(Path::new(folder)));
    assert!(read("docs/loopd.service").contains(&format!("\nReadWritePaths=-{folder}\n")));
}

#[test]
fn the_examples_expect_is_what_the_installed_server_reports() {
    let cfg = Config::load(&repo("docs/loopd.example.toml")).unwrap();
    let expect = cfg.expect.unwrap();
    // The template docs/production.md installs as /etc/llama-worker/chat-template.jinja.
    let template = std::fs::read(repo("fixtures/templates/smollm2-tools-thinking.jinja")).unwrap();
    assert_eq!(
        expect.chat_template_sha256,
        sha256(&template).unwrap().to_string()
    );
    assert_eq!(
        preset("chat-template-file"),
        "/etc/llama-worker/chat-template.jinja"
    );
    // The preset's context is shared by its slots.
    let slots: u32 = preset("np").parse().unwrap();
    let ctx: u64 = preset("c").parse().unwrap();
    assert_eq!(expect.total_slots, slots);
    assert_eq!(expect.n_ctx, ctx / u64::from(slots));
    assert!(read("docs/llama-server.preset.ini").contains(&format!("\n[{}]\n", cfg.model)));
}

#[test]
fn loopd_check_config_takes_the_example_as_shipped() {
    let path = repo("docs/loopd.example.toml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_loopd"))
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!((out.status.code(), stderr.as_ref()), (Some(0), ""));
    let sha = Config::load(&path)
        .unwrap()
        .expect
        .unwrap()
        .chat_template_sha256;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "{}: ok: model smollm2 on /run/inferproxy/infer.sock, serving on \
             /run/loopd/loopd.sock, template sha256 {sha}, n_ctx 4096, 2 slots, llama-worker \
             /run/llama-worker/status.sock\n",
            path.display()
        )
    );
}
