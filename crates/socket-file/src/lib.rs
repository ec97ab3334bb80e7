//! A daemon's listening Unix socket file: replace a stale one, refuse a live one or anything
//! else, mode 0600 (or 0660 when asked: [`Mode::Group`]), and later remove only the file this
//! process created. inferproxy's `infer.sock` and llama-worker's status socket are made this way.
//!
//! Promise: the socket never appears at its path with a mode other than the one asked for
//! (0600 by [`bind`]). It is bound under a staging name, given its mode, then renamed over the
//! path in one step, which also replaces a stale socket left by a killed process. A path that is not a socket, or a socket that a live
//! process still answers on (a second daemon started by mistake), is left alone and the start
//! is refused.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use core::fmt;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// Appended to the path to name the socket while its mode is set.
pub const STAGING_SUFFIX: &str = ".new";
/// Mode of the socket file by default ([`Mode::Owner`]): only the owner may connect.
pub const SOCKET_MODE: u32 = 0o600;

/// Who may connect to the socket. Others never may: the daemons behind these sockets have no
/// authentication of their own, so file permissions are the only gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// 0600: the owner only (and root). The default.
    #[default]
    Owner,
    /// 0660: the owner and the members of the file's group, which is the creating process's
    /// primary group (systemd's `Group=`), so daemons of one group can reach each other.
    Group,
}

impl Mode {
    /// The permission bits of the socket file.
    pub const fn bits(self) -> u32 {
        match self {
            Self::Owner => 0o600,
            Self::Group => 0o660,
        }
    }

    /// The mode as written on a command line and in logs: `0600` or `0660`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Owner => "0600",
            Self::Group => "0660",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A mode other than `0600`/`600` or `0660`/`660`; the text is handed back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeError(pub String);

impl fmt::Display for ModeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "socket mode `{}` is not 0600 (owner only) or 0660 (owner and group)",
            self.0
        )
    }
}

impl core::error::Error for ModeError {}

impl core::str::FromStr for Mode {
    type Err = ModeError;

    fn from_str(s: &str) -> Result<Self, ModeError> {
        match s {
            "0600" | "600" => Ok(Self::Owner),
            "0660" | "660" => Ok(Self::Group),
            _ => Err(ModeError(s.to_owned())),
        }
    }
}

/// Which step of creating the socket failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ListenError {
    /// Something other than a socket is at the path; it is not removed.
    NotASocket,
    /// A live process accepted a connection on the socket at the path.
    InUse,
    /// Looking at what is at the path failed.
    Inspect(io::ErrorKind),
    /// Removing a stale staging socket failed.
    RemoveStale(io::ErrorKind),
    /// `bind` failed.
    Bind(io::ErrorKind),
    /// Setting the mode failed.
    Chmod(io::ErrorKind),
    /// Moving the socket from its staging name to the path failed.
    Rename(io::ErrorKind),
}

impl fmt::Display for ListenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotASocket => write!(f, "exists and is not a socket; not removing it"),
            Self::InUse => write!(f, "another process is listening on it"),
            Self::Inspect(k) => write!(f, "cannot inspect it: {k}"),
            Self::RemoveStale(k) => write!(f, "cannot remove the stale staging socket: {k}"),
            Self::Bind(k) => write!(f, "cannot bind: {k}"),
            Self::Chmod(k) => write!(f, "cannot set the socket's mode: {k}"),
            Self::Rename(k) => write!(f, "cannot move the socket into place: {k}"),
        }
    }
}

impl core::error::Error for ListenError {}

/// A bound, listening socket and the identity of its file, so only that file is removed later.
#[derive(Debug)]
pub struct Bound {
    /// The listener, at `path` with the mode asked for.
    pub listener: UnixListener,
    path: PathBuf,
    file_id: (u64, u64),
}

impl Bound {
    /// Removes the socket file if it is still the one this process created (a daemon started
    /// later at the same path, or an operator's file, is left alone).
    pub fn remove_file(&self) {
        if let Ok(meta) = fs::symlink_metadata(&self.path) {
            if (meta.dev(), meta.ino()) == self.file_id {
                let _ = fs::remove_file(&self.path);
            }
        }
    }
}

/// What is at a path before binding.
enum Existing {
    Nothing,
    StaleSocket,
}

fn inspect(path: &Path) -> Result<Existing, ListenError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Existing::Nothing),
        Err(e) => return Err(ListenError::Inspect(e.kind())),
    };
    if !meta.file_type().is_socket() {
        return Err(ListenError::NotASocket);
    }
    // Connecting is the only way to know whether a listener is behind the file.
    match UnixStream::connect(path) {
        Ok(_) => Err(ListenError::InUse),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(Existing::StaleSocket),
        Err(e) => Err(ListenError::Inspect(e.kind())),
    }
}

/// Creates the listening socket at `path`, mode 0600, as the crate docs describe.
pub fn bind(path: &Path) -> Result<Bound, ListenError> {
    bind_with_mode(path, Mode::Owner)
}

/// [`bind`] with the socket's mode chosen: 0660 lets the file's group connect too.
pub fn bind_with_mode(path: &Path, mode: Mode) -> Result<Bound, ListenError> {
    inspect(path)?;
    let mut staging = OsString::from(path.as_os_str());
    staging.push(STAGING_SUFFIX);
    let staging = PathBuf::from(staging);
    if let Existing::StaleSocket = inspect(&staging)? {
        fs::remove_file(&staging).map_err(|e| ListenError::RemoveStale(e.kind()))?;
    }
    let listener = UnixListener::bind(&staging).map_err(|e| ListenError::Bind(e.kind()))?;
    let placed = fs::set_permissions(&staging, fs::Permissions::from_mode(mode.bits()))
        .map_err(|e| ListenError::Chmod(e.kind()))
        .and_then(|()| fs::rename(&staging, path).map_err(|e| ListenError::Rename(e.kind())))
        .and_then(|()| fs::symlink_metadata(path).map_err(|e| ListenError::Inspect(e.kind())));
    match placed {
        Ok(meta) => Ok(Bound {
            listener,
            path: path.to_owned(),
            file_id: (meta.dev(), meta.ino()),
        }),
        Err(e) => {
            let _ = fs::remove_file(&staging);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("socket-file-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn stale_is_replaced_live_and_files_are_refused() {
        let dir = scratch("cases");
        let path = dir.join("s.sock");
        // A stale socket: bound, then its listener dropped.
        drop(UnixListener::bind(&path).unwrap());
        let first = bind(&path).unwrap();
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, SOCKET_MODE);
        assert_eq!(bind(&path).unwrap_err(), ListenError::InUse);
        assert!(
            UnixStream::connect(&path).is_ok(),
            "the live one still answers"
        );
        drop(first);
        let file = dir.join("f");
        fs::write(&file, "keep").unwrap();
        assert_eq!(bind(&file).unwrap_err(), ListenError::NotASocket);
        assert_eq!(fs::read_to_string(&file).unwrap(), "keep");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn group_mode_is_0660_and_the_default_stays_0600() {
        let dir = scratch("modes");
        let path = dir.join("g.sock");
        let group = bind_with_mode(&path, Mode::Group).unwrap();
        let meta = fs::symlink_metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o660);
        group.remove_file();
        let owner = bind(&path).unwrap();
        let meta = fs::symlink_metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
        owner.remove_file();
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn mode_parses_only_owner_and_group() {
        assert_eq!("0600".parse(), Ok(Mode::Owner));
        assert_eq!("600".parse(), Ok(Mode::Owner));
        assert_eq!("0660".parse(), Ok(Mode::Group));
        assert_eq!("660".parse(), Ok(Mode::Group));
        for bad in ["", "0666", "0644", "0700", "0620", "06600", "rw"] {
            assert_eq!(bad.parse::<Mode>(), Err(ModeError(bad.to_owned())), "{bad}");
        }
        assert_eq!(
            ModeError("0666".into()).to_string(),
            "socket mode `0666` is not 0600 (owner only) or 0660 (owner and group)"
        );
        assert_eq!(Mode::default(), Mode::Owner);
        assert_eq!(Mode::Group.to_string(), "0660");
    }

    #[test]
    fn remove_file_leaves_a_socket_that_replaced_ours() {
        let dir = scratch("replaced");
        let path = dir.join("s.sock");
        let ours = bind(&path).unwrap();
        fs::remove_file(&path).unwrap();
        let theirs = UnixListener::bind(&path).unwrap();
        ours.remove_file();
        assert!(UnixStream::connect(&path).is_ok(), "theirs was removed");
        drop(theirs);
        let again = bind(&path).unwrap();
        again.remove_file();
        assert!(!path.exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}
