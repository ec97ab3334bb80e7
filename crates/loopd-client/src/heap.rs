//! Large fixed-size buffers, made straight on the heap.

/// A heap array of `N` zero bytes, made without building it on the stack (the allocator hands
/// out untouched zero pages, so even 1 MiB costs next to nothing until written).
pub(crate) fn array<const N: usize>() -> Box<[u8; N]> {
    vec![0u8; N]
        .into_boxed_slice()
        .try_into()
        .expect("the vec has exactly N bytes")
}
