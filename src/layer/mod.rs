//! The tower middleware: [`RateLimitLayer`] → [`RateLimit`] → [`ResponseFuture`].
//!
//! What clients see, and an example, are documented on [`RateLimitLayer`].

mod body;
mod builder;
mod error;
mod future;
// tower-http's layout: the layer type lives in `layer.rs` of its module.
#[allow(clippy::module_inception)]
mod layer;
mod service;

pub use self::body::ResponseBody;
pub use self::builder::RateLimitLayerBuilder;
pub use self::error::BuildError;
pub use self::future::ResponseFuture;
pub use self::layer::RateLimitLayer;
pub use self::service::RateLimit;
