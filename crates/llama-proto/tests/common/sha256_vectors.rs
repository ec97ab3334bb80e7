// SHA-256 vectors, computed independently with Python's hashlib and checked with sha256sum.
// Included by llama-proto's unit tests (src/hash.rs) and by the firmware check
// (embedded/src/bin/check.rs), so that the host and the device are held to the same digests.

/// The digest of the empty message.
pub const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
/// The digest of `abc`.
pub const ABC: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
/// The digest of one million `a`.
pub const MILLION_A: &str = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
/// Digests of `pattern(n)`: byte i is `(i * 7 + 3) % 256`; lengths straddle the padding edges.
pub const PATTERN: [(usize, &str); 5] = [
    (
        55,
        "e7313d333c272e639f790978283f9eb392e843d0f29b7016828bb1daa4aac70b",
    ),
    (
        56,
        "4324d65f3c103567f5589c710bc08f8523f929a9272e3af36fc968e52abc6c27",
    ),
    (
        63,
        "81c80242132f230c3bd41b3e63bbcff16107339549214a99614ff26664625055",
    ),
    (
        64,
        "39e3d7b6b5d075d37d053ad89b24b41bef4f3c29760c84447cab3f3be1882241",
    ),
    (
        65,
        "aacca6ff74fdbb296d165a45cecfa04e5127bc008770fbbdd48006f2d2fae95e",
    ),
];
