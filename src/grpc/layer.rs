use tower_layer::Layer;

use super::GrpcRefusal;

/// Applies [`GrpcRefusal`] to a service: fleetlimit's refusals of gRPC
/// requests become gRPC statuses (see the [module](super) for the
/// mapping). Place it around [`RateLimitLayer`](crate::RateLimitLayer).
///
/// ```
/// use fleetlimit::grpc::{GrpcRefusal, GrpcRefusalLayer};
/// use tower::Layer;
///
/// let service = tower::service_fn(|_req: http::Request<String>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// });
/// let _service: GrpcRefusal<_> = GrpcRefusalLayer::new().layer(service);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcRefusalLayer {
    _priv: (),
}

impl GrpcRefusalLayer {
    /// The layer (it has no settings: the mapping is fixed, and documented).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
}

impl<S> Layer<S> for GrpcRefusalLayer {
    type Service = GrpcRefusal<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcRefusal::new(inner)
    }
}
