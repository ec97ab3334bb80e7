//! [`BodyBuffer`]: a whole body collected into caller-provided storage of `N` bytes.

use core::borrow::BorrowMut;

use crate::HttpError;

/// A fixed-capacity byte buffer for a body; `N` is the cap ([`BODY_CAP`](crate::BODY_CAP), 4 MiB,
/// for the JSON endpoints).
///
/// The storage comes from the caller so that a 4 MiB array is never built on the stack: pass a
/// `&'static mut [u8; N]`, or a `Box<[u8; N]>` made on the heap, e.g.
/// `vec![0u8; N].into_boxed_slice().try_into()`.
pub struct BodyBuffer<S, const N: usize = { crate::BODY_CAP }> {
    storage: S,
    len: usize,
}

impl<S: BorrowMut<[u8; N]>, const N: usize> BodyBuffer<S, N> {
    /// An empty buffer over `storage` (its previous contents are ignored).
    pub fn new(storage: S) -> Self {
        Self { storage, len: 0 }
    }

    /// Appends `bytes`, or fails with [`HttpError::BodyTooLarge`] and appends nothing.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), HttpError> {
        if bytes.len() > self.room() {
            return Err(HttpError::BodyTooLarge);
        }
        let end = self.len + bytes.len();
        self.storage.borrow_mut()[self.len..end].copy_from_slice(bytes);
        self.len = end;
        Ok(())
    }

    /// The bytes collected so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.storage.borrow()[..self.len]
    }

    /// How many bytes were collected.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing was collected.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many more bytes fit.
    pub fn room(&self) -> usize {
        N - self.len
    }

    /// Forgets the contents, keeping the storage.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Gives the storage back.
    pub fn into_storage(self) -> S {
        self.storage
    }
}

impl<S, const N: usize> core::fmt::Debug for BodyBuffer<S, N> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BodyBuffer")
            .field("len", &self.len)
            .field("cap", &N)
            .finish()
    }
}
