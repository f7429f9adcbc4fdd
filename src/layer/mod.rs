//! The tower middleware: [`RateLimitLayer`](crate::RateLimitLayer) →
//! [`RateLimit`] → [`ResponseFuture`], and the [`RateLimitLayerBuilder`]
//! that makes the layer.
//!
//! What clients see, and an example, are documented on
//! [`RateLimitLayer`](crate::RateLimitLayer), which is at the crate root
//! with [`BuildError`](crate::BuildError).

mod body;
mod builder;
pub(crate) mod error;
mod future;
// tower-http's layout: the layer type lives in `layer.rs` of its module.
#[allow(clippy::module_inception)]
pub(crate) mod layer;
mod service;
mod stats;

pub use self::body::ResponseBody;
pub use self::builder::RateLimitLayerBuilder;
pub use self::future::ResponseFuture;
pub use self::service::RateLimit;
pub use self::stats::Stats;
