//! The `[[host]]` table: one inference host this daemon uses, and the rules a list of them
//! keeps. [`Fleet::new`] is the only way to a [`Fleet`], so a `Fleet` always has at least one
//! host, unique well-formed names, and per host a non-empty list of distinct slots, each below
//! the `[expect] total_slots` every host shares. A refusal is a [`FleetError`] that names the
//! key to blame (`host[1].slots`, 0-based in file order). [`HostState`] is what the daemon
//! knows of a host: the health machine's word, placement's input.

use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;
use worker_proto::State;

use super::request::SubmitError;

/// Longest host name, in bytes. A name goes into metric labels, events and the tunnel's
/// socket paths (`/run/loopd-tunnel/NAME/infer.sock`), so it is also limited to ASCII letters,
/// digits, `-` and `_`.
pub const MAX_HOST_NAME_BYTES: usize = 64;

/// One `[[host]]` entry, as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// The host's name, unique in the file.
    pub name: String,
    /// The Unix socket that reaches this host's llama-server (inferproxy, or a tunnel end).
    pub infer_socket: PathBuf,
    /// The Unix socket that reaches this host's llama-worker status socket.
    pub worker_socket: PathBuf,
    /// The server slots (`id_slot`) this daemon owns on the host.
    pub slots: Vec<u32>,
    /// The host's server's `--slot-save-path`, as this daemon sees it: sessions' KV files
    /// are saved and restored there (`[runner.kv]`); without it, not on this host.
    #[serde(default)]
    pub kv_dir: Option<PathBuf>,
}

/// A host's index in `[[host]]` order (0-based); config order breaks placement ties.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostId(pub usize);

/// A seat: one owned slot on one host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostSlot {
    /// The host.
    pub host: HostId,
    /// The server slot (`id_slot`) on it.
    pub slot: u32,
}

/// What the daemon knows of a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostState {
    /// No state line yet.
    Unknown,
    /// The worker's last state line.
    Worker(State),
    /// Lost: silent, refused or ended; ready again only on a new watch's `ready`.
    Lost,
}

impl HostState {
    /// Whether new requests may go there.
    pub fn is_ready(self) -> bool {
        self == HostState::Worker(State::Ready)
    }

    /// The refusal a submit gets from this host alone: none when ready. Unknown and lost are
    /// `WORKER_NOT_READY`, like a worker whose socket does not answer.
    pub fn refusal(self) -> Option<SubmitError> {
        match self {
            HostState::Worker(s) => SubmitError::of_worker_state(s),
            HostState::Unknown | HostState::Lost => Some(SubmitError::WorkerNotReady),
        }
    }

    /// `unknown`, `lost`, or the worker's state name (`ready`, `restarting`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            HostState::Unknown => "unknown",
            HostState::Lost => "lost",
            HostState::Worker(s) => s.as_str(),
        }
    }
}

/// Why a list of hosts was refused. `host` is the 0-based index of the entry to blame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FleetError {
    /// No `[[host]]` at all.
    NoHosts,
    /// A name that is empty, longer than [`MAX_HOST_NAME_BYTES`], or has a byte other than
    /// an ASCII letter, digit, `-` or `_`.
    BadName {
        /// The entry.
        host: usize,
    },
    /// A name an earlier entry has.
    DuplicateName {
        /// The entry.
        host: usize,
        /// The earlier entry with that name.
        first: usize,
    },
    /// `slots = []`.
    NoSlots {
        /// The entry.
        host: usize,
    },
    /// A slot listed twice on one host.
    DuplicateSlot {
        /// The entry.
        host: usize,
        /// The slot.
        slot: u32,
    },
    /// A slot the server does not have (`[expect] total_slots`).
    SlotOutOfRange {
        /// The entry.
        host: usize,
        /// The slot.
        slot: u32,
        /// `[expect] total_slots`.
        total_slots: u32,
    },
}

impl FleetError {
    /// The key to blame: `host`, `host[i].name` or `host[i].slots`.
    pub fn key(&self) -> String {
        match *self {
            FleetError::NoHosts => "host".to_string(),
            FleetError::BadName { host } | FleetError::DuplicateName { host, .. } => {
                format!("host[{host}].name")
            }
            FleetError::NoSlots { host }
            | FleetError::DuplicateSlot { host, .. }
            | FleetError::SlotOutOfRange { host, .. } => format!("host[{host}].slots"),
        }
    }
}

impl fmt::Display for FleetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key `{}`: ", self.key())?;
        match *self {
            FleetError::NoHosts => f.write_str("at least one [[host]] is needed"),
            FleetError::BadName { .. } => write!(
                f,
                "a name is 1 to {MAX_HOST_NAME_BYTES} bytes of ASCII letters, digits, `-` and `_`"
            ),
            FleetError::DuplicateName { first, .. } => {
                write!(f, "host[{first}] has this name already")
            }
            FleetError::NoSlots { .. } => f.write_str("at least one slot is needed"),
            FleetError::DuplicateSlot { slot, .. } => write!(f, "slot {slot} is listed twice"),
            FleetError::SlotOutOfRange {
                slot, total_slots, ..
            } => write!(
                f,
                "slot {slot} does not exist: the server has {total_slots} (expect.total_slots)"
            ),
        }
    }
}

impl std::error::Error for FleetError {}

/// A checked list of hosts, in config order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fleet {
    hosts: Vec<HostConfig>,
}

impl Fleet {
    /// Checks `hosts` against the rules in the module docs; `total_slots` is `[expect]
    /// total_slots`. The first broken rule, in file order, is the error.
    pub fn new(hosts: Vec<HostConfig>, total_slots: u32) -> Result<Fleet, FleetError> {
        if hosts.is_empty() {
            return Err(FleetError::NoHosts);
        }
        for (i, h) in hosts.iter().enumerate() {
            if !name_ok(&h.name) {
                return Err(FleetError::BadName { host: i });
            }
            if let Some(first) = hosts[..i].iter().position(|o| o.name == h.name) {
                return Err(FleetError::DuplicateName { host: i, first });
            }
            if h.slots.is_empty() {
                return Err(FleetError::NoSlots { host: i });
            }
            for (j, &slot) in h.slots.iter().enumerate() {
                if slot >= total_slots {
                    return Err(FleetError::SlotOutOfRange {
                        host: i,
                        slot,
                        total_slots,
                    });
                }
                if h.slots[..j].contains(&slot) {
                    return Err(FleetError::DuplicateSlot { host: i, slot });
                }
            }
        }
        Ok(Fleet { hosts })
    }

    /// The hosts, in config order ([`HostId`] `i` is `hosts()[i]`).
    pub fn hosts(&self) -> &[HostConfig] {
        &self.hosts
    }

    /// The host named `name`.
    pub fn id_of(&self, name: &str) -> Option<HostId> {
        self.hosts.iter().position(|h| h.name == name).map(HostId)
    }
}

fn name_ok(name: &str) -> bool {
    (1..=MAX_HOST_NAME_BYTES).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        host: Vec<HostConfig>,
    }

    fn host(name: &str, slots: &[u32]) -> HostConfig {
        HostConfig {
            name: name.into(),
            infer_socket: format!("/run/loopd-tunnel/{name}/infer.sock").into(),
            worker_socket: format!("/run/loopd-tunnel/{name}/status.sock").into(),
            slots: slots.to_vec(),
            kv_dir: None,
        }
    }

    #[test]
    fn two_hosts_parse_and_pass() {
        let text = "[[host]]\nname = \"a\"\ninfer_socket = \"/run/loopd-tunnel/a/infer.sock\"\n\
                    worker_socket = \"/run/loopd-tunnel/a/status.sock\"\nslots = [0, 1]\n\
                    [[host]]\nname = \"b\"\ninfer_socket = \"/run/loopd-tunnel/b/infer.sock\"\n\
                    worker_socket = \"/run/loopd-tunnel/b/status.sock\"\nslots = [1]\n";
        let doc: Doc = toml::from_str(text).unwrap();
        assert_eq!(doc.host, vec![host("a", &[0, 1]), host("b", &[1])]);
        let fleet = Fleet::new(doc.host, 2).unwrap();
        assert_eq!(fleet.id_of("b"), Some(HostId(1)));
        assert_eq!(fleet.id_of("c"), None);
    }

    #[test]
    fn unknown_key_is_refused() {
        let text = "[[host]]\nname = \"a\"\ninfer_socket = \"/i\"\nworker_socket = \"/w\"\n\
                    slots = [0]\nport = 8080\n";
        let e = toml::from_str::<Doc>(text).unwrap_err();
        assert!(e.message().contains("unknown field `port`"), "{e}");
    }

    #[test]
    fn each_rule_names_its_key() {
        let cases = [
            (vec![], FleetError::NoHosts, "host"),
            (
                vec![host("", &[0])],
                FleetError::BadName { host: 0 },
                "host[0].name",
            ),
            (
                vec![host("a", &[0]), host("a/b", &[0])],
                FleetError::BadName { host: 1 },
                "host[1].name",
            ),
            (
                vec![host("a", &[0]), host("b", &[0]), host("a", &[1])],
                FleetError::DuplicateName { host: 2, first: 0 },
                "host[2].name",
            ),
            (
                vec![host("a", &[])],
                FleetError::NoSlots { host: 0 },
                "host[0].slots",
            ),
            (
                vec![host("a", &[0]), host("b", &[1, 0, 1])],
                FleetError::DuplicateSlot { host: 1, slot: 1 },
                "host[1].slots",
            ),
            (
                vec![host("a", &[0, 2])],
                FleetError::SlotOutOfRange {
                    host: 0,
                    slot: 2,
                    total_slots: 2,
                },
                "host[0].slots",
            ),
        ];
        for (hosts, want, key) in cases {
            let e = Fleet::new(hosts, 2).unwrap_err();
            assert_eq!(e, want);
            assert_eq!(e.key(), key);
            assert!(e.to_string().starts_with(&format!("key `{key}`: ")), "{e}");
        }
        assert_eq!(
            FleetError::DuplicateSlot { host: 1, slot: 1 }.to_string(),
            "key `host[1].slots`: slot 1 is listed twice"
        );
    }

    #[test]
    fn the_same_slot_on_two_hosts_is_fine() {
        assert!(Fleet::new(vec![host("a", &[0, 1]), host("b", &[0, 1])], 2).is_ok());
    }

    #[test]
    fn name_length_at_the_limit_and_one_past() {
        let at = "n".repeat(MAX_HOST_NAME_BYTES);
        assert!(Fleet::new(vec![host(&at, &[0])], 1).is_ok());
        let past = "n".repeat(MAX_HOST_NAME_BYTES + 1);
        assert_eq!(
            Fleet::new(vec![host(&past, &[0])], 1),
            Err(FleetError::BadName { host: 0 })
        );
        assert!(Fleet::new(vec![host("gpu-box_2", &[0])], 1).is_ok());
    }
}
