//! Where a request's key comes from, and how it becomes a Redis key.
//!
//! A limit counts requests per *key*: an API key header, an account, the
//! client's IP address, IP and account together, one global bucket, or a
//! key the application computes (`custom:<name>`, see
//! [`key_fn`](crate::layer::RateLimitLayerBuilder::key_fn)).
//!
//! The client IP is the TCP peer (`ConnectInfo<SocketAddr>`, axum's
//! `MockConnectInfo<SocketAddr>`, or a plain `SocketAddr` extension for hyper
//! users). `X-Forwarded-For` / `Forwarded` are read **only** when the peer is
//! one of the configured trusted proxies, walking right to left past trusted
//! hops: the first untrusted hop is the client. A client-sent header is never
//! trusted by default. IPv6 addresses are grouped by prefix (`/64` default),
//! since one subscriber usually holds a whole `/64`.
//!
//! Redis keys look like `rl:per-account:{a:bob}`: prefix, limit name, then
//! the key's kind and value inside a hash tag. A value that is long (over 64
//! bytes) or holds anything but printable ASCII other than `{` and `}` is
//! replaced by a SHA-256 digest (`{a#<32 hex>}`), so a client can neither make
//! a huge key nor choose its Redis Cluster slot, and raw and hashed forms can
//! never collide (`:` versus `#`). Header values (API keys) and custom keys
//! may be secrets: in Redis they are always stored as a keyed digest,
//! SipHash-2-4 (128 bits) keyed by the `KeySecret` (`rl:per-key:{h#<32 hex>}`,
//! `rl:per-tenant:{c#<32 hex>}`), so reading Redis key names reveals no API
//! key and confirms no guessed tenant.
//! The digest depends on the value only, so every key of one caller still
//! shares one hash tag, hence one cluster slot.
//!
//! | file | what |
//! |------|------|
//! | `source.rs` | [`KeySource`], [`Account`]: what a limit counts by, and what a request carries |
//! | `custom.rs` | `KeyExtractor`, [`KeyAnswer`]: keys the application computes, by name |
//! | `client_ip.rs` | [`ClientIpRules`], `ForwardedHeader`: the client IP behind trusted proxies |
//! | `store_key.rs` | key material → a typed `StoreKey` (its log id, its plan key), the `KeySecret`, and the one parser of keys read back from Redis |

mod client_ip;
mod custom;
mod extracted;
mod source;
mod store_key;

pub(crate) use client_ip::ClientIpRules;
pub(crate) use client_ip::ForwardedHeader;
pub use custom::KeyAnswer;
pub(crate) use custom::KeyExtractor;
pub use source::{Account, KeySource};

pub(crate) use custom::CustomKeys;
pub(crate) use extracted::Extracted;
pub(crate) use source::{check_custom_name, is_name};

pub(crate) use store_key::{
    KeyHead, KeyMaterial, KeySecret, LogId, MIN_SECRET_BYTES, SecretOrigin, ShownId, StoreKey,
};
