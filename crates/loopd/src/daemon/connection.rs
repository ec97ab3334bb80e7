//! One connection of `loopd serve`: its command line read within [`READ_DEADLINE`] and
//! [`MAX_LINE_BYTES`], parsed into a command that applies itself (`commands.rs`), and every
//! reply line written within the write deadline.

use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use super::line::send;
use super::listener::{Daemon, READ_DEADLINE, WRITE_DEADLINE};
use super::protocol::{self, ProtoError, MAX_LINE_BYTES};

impl Daemon {
    /// Reads one command line within [`READ_DEADLINE`] and the cap.
    fn read_line(&self, stream: &UnixStream) -> Result<Option<Vec<u8>>, ProtoError> {
        let clock = &self.state.clock;
        let deadline = clock.now() + READ_DEADLINE;
        let mut line = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            let left = deadline.saturating_sub(clock.now());
            if left.is_zero() {
                return Err(ProtoError::ReadTimeout);
            }
            let _ = stream.set_read_timeout(Some(left));
            match (&*stream).read(&mut buf) {
                Ok(0) if line.is_empty() => return Ok(None),
                Ok(0) => return Ok(Some(line)),
                Ok(n) => {
                    if let Some(end) = buf[..n].iter().position(|&b| b == b'\n') {
                        line.extend_from_slice(&buf[..end]);
                        return if line.len() >= MAX_LINE_BYTES {
                            Err(ProtoError::LineTooLong)
                        } else {
                            Ok(Some(line))
                        };
                    }
                    line.extend_from_slice(&buf[..n]);
                    // The newline counts towards the cap.
                    if line.len() >= MAX_LINE_BYTES {
                        return Err(ProtoError::LineTooLong);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(ProtoError::ReadTimeout)
                }
                Err(_) => return Ok(None),
            }
        }
    }

    /// Serves one connection: one command, its reply (or its stream of events).
    pub(super) fn connection(self: &Arc<Daemon>, stream: &UnixStream) -> io::Result<()> {
        stream.set_nonblocking(false)?;
        stream.set_write_timeout(Some(WRITE_DEADLINE))?;
        let line = match self.read_line(stream) {
            Ok(Some(l)) => l,
            Ok(None) => return Ok(()),
            Err(e) => return send(stream, &e.to_line()),
        };
        match protocol::parse(&line) {
            Ok(cmd) => self.apply(stream, cmd, &line),
            Err(e) => send(stream, &e.to_line()),
        }
    }
}
