//! Hot reload: a layer's configuration swapped whole, without a restart
//! ([`ReloadHandle`], from
//! [`RateLimitLayer::reload_handle`](crate::RateLimitLayer::reload_handle)).
//!
//! The layer holds its limiter (routes, policies, and the caches that
//! answer under their numbers) in an [`ArcSwap`](arc_swap::ArcSwap): a request loads it once,
//! in the service's `call`, and keeps that one until its response is over;
//! a reload builds the next one on the same core (stores and every
//! bucket in them, breaker, fleet size, shedder, tasks) and swaps it in, so
//! the request after the swap decides under the new numbers.
//!
//! What the core was built from cannot change: a reload that changes it is
//! refused, naming each setting, and the running configuration goes on. So
//! is one that would leave nothing limited, or remove more of the limits
//! and routes than the handle's guard allows, unless forced: the marks of
//! an empty or half-written file.
//!
//! A file is read and parsed on a thread of its own, never on the
//! runtime's workers, under a timeout: a configuration path that blocks (a
//! FIFO, a hung network mount) costs that thread, not the service.

mod changes;
mod error;
mod handle;
mod live;
mod options;

pub use self::changes::Changes;
pub use self::error::ReloadError;
pub use self::handle::ReloadHandle;
pub(crate) use self::live::{Live, OwnRedis, start_recorder};
