//! `loopd check-config` and `loopd probe`: a config checked as the commands would refuse it,
//! without a server; and a server's `GET /props` printed as the `[expect]` section that
//! matches it, so an operator can point loopd at a server they did not set up.

use std::path::{Path, PathBuf};

use loopd::Config;
use loopd_client::config::Expect;
use loopd_client::{Client, ClientConfig, InferError};

use crate::exit::{Exit, Fail};
use crate::stdout;

/// Loads `path` as every command does: a refusal names the file, the line and the key.
pub fn load(path: &Path) -> Result<Config, Fail> {
    Config::load(path).map_err(|e| Fail::new(Exit::Usage, format!("bad config: {e}")))
}

/// What `loopd serve` needs of a config beyond what every command does: its `[daemon]
/// socket`, and an `[expect]` for its self-test.
pub fn serve_needs(config: &Config, path: &Path) -> Result<PathBuf, Fail> {
    let missing = |key: &str, why: &str| {
        Fail::new(
            Exit::Usage,
            format!(
                "bad config: {}: key `{key}`: missing: {why}",
                path.display()
            ),
        )
    };
    if config.expect.is_none() {
        return Err(missing(
            "expect",
            "loopd serve's self-test compares the server with it (`loopd probe` prints it)",
        ));
    }
    config
        .daemon
        .socket
        .clone()
        .ok_or_else(|| missing("daemon.socket", "loopd serve listens on it"))
}

/// `loopd check-config`: the config as `loopd serve` would take it, in one line; with
/// `probe`, then the server's `[expect]`, which must match the config's.
pub fn check_config(path: &Path, probe: bool) -> Result<Exit, Fail> {
    let config = load(path)?;
    let socket = serve_needs(&config, path)?;
    let expect = config.expect.as_ref().map(expect_words).unwrap_or_default();
    let worker = config
        .runner
        .worker_socket
        .as_deref()
        .map_or("no llama-worker".to_owned(), |w| {
            format!("llama-worker {}", w.display())
        });
    stdout::print(&format!(
        "{}: ok: model {} on {}, serving on {}, {expect}, {worker}\n",
        path.display(),
        config.model,
        config.socket.display(),
        socket.display(),
    ))?;
    if !probe {
        return Ok(Exit::Completed);
    }
    let got = props(&config.socket, &config.model)?;
    stdout::print(&expect_toml(&got))?;
    match config.expect {
        Some(want) if same(&want, &got) => Ok(Exit::Completed),
        Some(want) => Err(Fail::new(
            Exit::Failed,
            format!(
                "the server on {} differs from [expect]: it serves {}; the config expects {}",
                config.socket.display(),
                expect_words(&got),
                expect_words(&want)
            ),
        )),
        None => Ok(Exit::Completed),
    }
}

/// `loopd probe`: the server's `[expect]` section on stdout.
pub fn probe(socket: &Path, model: Option<&str>) -> Result<Exit, Fail> {
    let got = props(socket, model.unwrap_or_default())?;
    stdout::print(&expect_toml(&got))?;
    Ok(Exit::Completed)
}

/// `GET /props` on `socket` for `model` (empty: the server's one model), as `[expect]`.
fn props(socket: &Path, model: &str) -> Result<Expect, Fail> {
    let client = Client::new(ClientConfig::new(socket, model));
    let p = client.props().map_err(|e| match e {
        // Its message names the socket.
        InferError::Connect { .. } => Fail::new(Exit::Unreachable, e.to_string()),
        InferError::TimedOut(_) => Fail::new(
            Exit::Unreachable,
            format!("GET /props on {}: {e}", socket.display()),
        ),
        _ => {
            let hint = if model.is_empty() {
                " (a router needs --model)"
            } else {
                ""
            };
            Fail::new(
                Exit::Failed,
                format!("GET /props on {}: {e}{hint}", socket.display()),
            )
        }
    })?;
    let hash = llama_proto::hash::sha256(p.chat_template.as_bytes())
        .map_err(|e| Fail::new(Exit::Failed, format!("hashing chat_template: {e}")))?;
    Ok(Expect {
        chat_template_sha256: hash.to_string(),
        n_ctx: p.n_ctx,
        total_slots: p.total_slots,
    })
}

/// Whether the server's `[expect]` is the config's (the self-test's comparison: the hash in
/// either case).
fn same(want: &Expect, got: &Expect) -> bool {
    want.chat_template_sha256
        .eq_ignore_ascii_case(&got.chat_template_sha256)
        && want.n_ctx == got.n_ctx
        && want.total_slots == got.total_slots
}

/// `[expect]` as the config writes it.
fn expect_toml(e: &Expect) -> String {
    format!(
        "[expect]\nchat_template_sha256 = \"{}\"\nn_ctx = {}\ntotal_slots = {}\n",
        e.chat_template_sha256, e.n_ctx, e.total_slots
    )
}

/// `[expect]` in words, for one line.
fn expect_words(e: &Expect) -> String {
    format!(
        "template sha256 {}, n_ctx {}, {} slots",
        e.chat_template_sha256.to_ascii_lowercase(),
        e.n_ctx,
        e.total_slots
    )
}
