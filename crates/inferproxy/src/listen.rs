//! Creating the listening socket: replace a stale one, refuse anything else, mode 0600.
//!
//! Promise: the socket never appears at its path with a mode other than 0600. It is bound under
//! a staging name, given its mode, then renamed over the path in one step, which also replaces a
//! stale socket left by a killed process. A path that is not a socket, or a socket that a live
//! process still answers on, is left alone and the start is refused.

use core::fmt;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// Appended to the path to name the socket while its mode is set.
pub const STAGING_SUFFIX: &str = ".new";
/// Mode of the socket file: only the owner (the agent daemon's user) may connect.
pub const SOCKET_MODE: u32 = 0o600;

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
            Self::Chmod(k) => write!(f, "cannot set mode 0600: {k}"),
            Self::Rename(k) => write!(f, "cannot move the socket into place: {k}"),
        }
    }
}

impl core::error::Error for ListenError {}

/// A bound, listening socket and the identity of its file, so only that file is removed later.
#[derive(Debug)]
pub struct Bound {
    /// The listener, mode 0600, at `path`.
    pub listener: UnixListener,
    path: PathBuf,
    file_id: (u64, u64),
}

impl Bound {
    /// Removes the socket file if it is still the one this process created.
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

/// Creates the listening socket at `path` as the module docs describe.
pub fn bind(path: &Path) -> Result<Bound, ListenError> {
    inspect(path)?;
    let mut staging = OsString::from(path.as_os_str());
    staging.push(STAGING_SUFFIX);
    let staging = PathBuf::from(staging);
    if let Existing::StaleSocket = inspect(&staging)? {
        fs::remove_file(&staging).map_err(|e| ListenError::RemoveStale(e.kind()))?;
    }
    let listener = UnixListener::bind(&staging).map_err(|e| ListenError::Bind(e.kind()))?;
    let placed = fs::set_permissions(&staging, fs::Permissions::from_mode(SOCKET_MODE))
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
