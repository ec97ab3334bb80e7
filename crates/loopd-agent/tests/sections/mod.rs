//! The sections of loopd's config file that the runner's tests set, in one value as the file
//! gives them: the client's ([`ClientConfig`]) and the runner's (`[runner]`). The client is
//! built from [`Config::client`]; the runner is given `runner`.
#![allow(dead_code)]

use std::path::PathBuf;

use loopd_agent::runner::RunnerConfig;
use loopd_client::config::{Expect, Limits, Retry, Sampling};
use loopd_client::ClientConfig;

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub socket: PathBuf,
    pub model: String,
    pub limits: Limits,
    pub retry: Retry,
    pub sampling: Sampling,
    pub expect: Option<Expect>,
    pub runner: RunnerConfig,
}

impl Config {
    /// Every default, as a file that names only `socket` and `model`.
    pub fn new(socket: impl Into<PathBuf>, model: impl Into<String>) -> Config {
        let client = ClientConfig::new(socket, model);
        Config {
            socket: client.socket,
            model: client.model,
            limits: client.limits,
            retry: client.retry,
            sampling: client.sampling,
            expect: client.expect,
            runner: RunnerConfig::default(),
        }
    }

    /// The client's sections.
    pub fn client(&self) -> ClientConfig {
        ClientConfig {
            socket: self.socket.clone(),
            model: self.model.clone(),
            limits: self.limits,
            retry: self.retry.clone(),
            sampling: self.sampling,
            expect: self.expect.clone(),
        }
    }
}
