//! The example configs as shipped: each parses and validates, names the production layout of
//! docs/production.md, and agrees with docs/llama-worker.service and docs/boxmaker.tmpfiles.conf.
//! (`make install-check` runs them for real under a temporary root; this is the quick half.)

use std::path::{Path, PathBuf};

use llama_worker::Config;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The words of the unit's ExecStart= line (the units quote nothing).
fn exec_start(unit: &str) -> Vec<String> {
    let text = read(unit);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .unwrap_or_else(|| panic!("{unit}: no ExecStart="));
    line.split_whitespace().map(str::to_owned).collect()
}

/// The value after `flag` in `words`.
fn flag<'a>(words: &'a [String], flag: &str) -> &'a str {
    let at = words.iter().position(|w| w == flag).unwrap();
    &words[at + 1]
}

/// The metrics folder docs/boxmaker.tmpfiles.conf creates.
fn metrics_folder() -> PathBuf {
    let text = read("docs/boxmaker.tmpfiles.conf");
    let line = text.lines().find(|l| l.starts_with("d ")).unwrap();
    PathBuf::from(line.split_whitespace().nth(1).unwrap())
}

#[test]
fn the_example_is_the_units_config_in_the_production_layout() {
    let cfg = Config::from_toml(&read("crates/llama-worker/llama-worker.example.toml")).unwrap();
    assert_eq!(cfg.command, "/usr/local/lib/boxmaker/llama-server");
    assert_eq!(
        cfg.args,
        [
            "--models-preset",
            "/etc/llama-worker/preset.ini",
            "--models-max",
            "1",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--slots",
            "--jinja"
        ]
    );
    assert_eq!(cfg.models, ["smollm2"]);
    assert_eq!(
        cfg.log_file.as_deref(),
        Some(Path::new("/var/log/llama-worker/server.log"))
    );
    let unit = exec_start("docs/llama-worker.service");
    assert_eq!(unit[0], "/usr/local/bin/llama-worker");
    assert_eq!(
        flag(&unit, "--config"),
        "/etc/llama-worker/llama-worker.toml"
    );
    assert_eq!(flag(&unit, "--socket-mode"), "0660");
    // The unit's --socket wins over status_socket; both name the same file.
    assert_eq!(
        cfg.status_socket.as_deref(),
        Some(Path::new(flag(&unit, "--socket")))
    );
    // LogsDirectory=llama-worker is /var/log/llama-worker.
    assert!(read("docs/llama-worker.service").contains("\nLogsDirectory=llama-worker\n"));
    let metrics = cfg.metrics_file.unwrap();
    assert_eq!(metrics.parent(), Some(metrics_folder().as_path()));
    assert!(read("docs/llama-worker.service").contains(&format!(
        "\nReadWritePaths=-{}\n",
        metrics_folder().display()
    )));
}

#[test]
fn the_rpc_example_names_the_same_layout() {
    let cfg =
        Config::from_toml(&read("crates/llama-worker/llama-worker.rpc.example.toml")).unwrap();
    assert_eq!(cfg.command, "/usr/local/lib/boxmaker/llama-server");
    assert_eq!(
        &cfg.args[..2],
        [
            "-m",
            "/var/lib/llama/models/SmolLM2-135M-Instruct.Q4_1.gguf"
        ]
    );
    let rpc = cfg.rpc.unwrap();
    assert_eq!(rpc.remote, ["10.0.0.2:50052"]);
    assert_eq!(rpc.local.len(), 2);
    for l in &rpc.local {
        assert_eq!(l.command, "/usr/local/lib/boxmaker/ggml-rpc-server");
    }
    assert_eq!(
        exec_start("docs/ggml-rpc-server.service")[0],
        "/usr/local/lib/boxmaker/ggml-rpc-server"
    );
}

#[test]
fn the_preset_names_the_model_and_template_where_production_md_puts_them() {
    let preset = read("docs/llama-server.preset.ini");
    let lines: Vec<&str> = preset
        .lines()
        .filter(|l| !l.starts_with(';') && !l.is_empty())
        .collect();
    assert_eq!(
        lines,
        [
            "version = 1",
            "[smollm2]",
            "model = /var/lib/llama/models/SmolLM2-135M-Instruct.Q4_1.gguf",
            "chat-template-file = /etc/llama-worker/chat-template.jinja",
            "jinja = true",
            "c = 8192",
            "np = 2",
            "load-on-startup = true",
        ]
    );
}
