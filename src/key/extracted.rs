//! What a limit's key source finds in a request: the key material, or why
//! there is none. Its own file so that the sources (`source.rs`) and the
//! application's extractors (`custom.rs`) share it without importing each
//! other.

use super::store_key::KeyMaterial;

/// What a key source found in a request.
#[derive(Debug)]
pub(crate) enum Extracted<'a> {
    Found(KeyMaterial<'a>),
    /// The request does not carry the key (no header, no account).
    Missing,
    /// The server gave the layer no peer address (a setup problem, not the
    /// client's doing).
    NoClientIp,
    /// A custom key's extractor found the key invalid.
    Invalid,
    /// A custom key's extractor panicked.
    Failed,
}
