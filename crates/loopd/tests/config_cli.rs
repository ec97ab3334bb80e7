//! A config is read the same way by every command: `loopd ask` on a config that only shortens
//! `limits.liveness_ms` gets past the config (to the socket), and one whose written
//! `runner.stall_ms` exceeds it is refused with the key, both values and the line.

use std::path::Path;
use std::process::Command;

fn ask(config: &Path) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_loopd"))
        .args(["ask", "--config"])
        .arg(config)
        .arg("hi")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn loopd_ask_takes_a_shorter_liveness_alone_and_names_a_stall_ms_past_it() {
    let dir = llama_harness::temp_dir("config-cli");
    let socket = dir.join("absent.sock");
    let config = dir.join("loopd.toml");
    let head = format!(
        "socket = {:?}\nmodel = \"m\"\n",
        socket.display().to_string()
    );

    std::fs::write(&config, format!("{head}[limits]\nliveness_ms = 3000\n")).unwrap();
    // Status 6: nothing answers on the socket (docs/loopd.md, exit status).
    assert_eq!(
        ask(&config),
        (
            Some(6),
            format!(
                "loopd ask: cannot reach the inference socket {}: No such file or directory \
                 (os error 2) (is inferproxy running?)\n",
                socket.display()
            )
        )
    );

    let text = format!("{head}[limits]\nliveness_ms = 3000\n[runner]\nstall_ms = 3001\n");
    std::fs::write(&config, text).unwrap();
    // Status 2: the config is refused, with its key.
    assert_eq!(
        ask(&config),
        (
            Some(2),
            format!(
                "loopd ask: bad config: {}:6: key `runner.stall_ms`: 3001 is greater than \
                 limits.liveness_ms (3000): the client would end the generation as stalled \
                 before the stall report was due; lower runner.stall_ms to at most 3000 (or \
                 leave it out to follow limits.liveness_ms), or raise limits.liveness_ms to at \
                 least 3001\n",
                config.display()
            )
        )
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
