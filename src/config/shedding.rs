//! `[shedding]`: its lowering from TOML (see [`SheddingConfig`]); its
//! checks are `validate/shedding.rs`'s.

use std::time::Duration;

use toml::Spanned;

use super::schema::RawShedding;
use super::validate::Span;
use super::{units, ConfigError};
use crate::shed::SheddingConfig;

/// Where `[shedding]`'s settings were written.
#[derive(Clone, Debug, Default)]
pub(super) struct SheddingSpans {
    pub(super) max_in_flight: Span,
    pub(super) target: Span,
    pub(super) interval: Span,
    pub(super) refresh: Span,
    pub(super) retry_after: Span,
    pub(super) sheddable_at: Span,
    pub(super) critical_at: Span,
}

fn span<T>(v: &Option<Spanned<T>>) -> Span {
    v.as_ref().map(Spanned::span)
}

/// The settings a `[shedding]` table says, defaults filled in.
pub(super) fn lower(
    src: &str,
    raw: &RawShedding,
) -> Result<(SheddingConfig, SheddingSpans), ConfigError> {
    let duration = |d: &Option<Spanned<String>>, default: Duration| match d {
        Some(d) => units::parse_duration(d.get_ref())
            .map_err(|e| ConfigError::at(src, Some(d.span()), e.to_string())),
        None => Ok(default),
    };
    let base = SheddingConfig::default();
    let cfg = SheddingConfig {
        max_in_flight: raw.max_in_flight.as_ref().map(|n| *n.get_ref()),
        queue_delay_target: duration(&raw.queue_delay_target, base.queue_delay_target)?,
        queue_delay_interval: duration(&raw.queue_delay_interval, base.queue_delay_interval)?,
        fleet_signal_refresh: duration(&raw.fleet_signal_refresh, base.fleet_signal_refresh)?,
        retry_after: duration(&raw.retry_after, base.retry_after)?,
        sheddable_at: raw
            .sheddable_at
            .as_ref()
            .map_or(base.sheddable_at, |v| *v.get_ref()),
        critical_at: raw
            .critical_at
            .as_ref()
            .map_or(base.critical_at, |v| *v.get_ref()),
    };
    let spans = SheddingSpans {
        max_in_flight: span(&raw.max_in_flight),
        target: span(&raw.queue_delay_target),
        interval: span(&raw.queue_delay_interval),
        refresh: span(&raw.fleet_signal_refresh),
        retry_after: span(&raw.retry_after),
        sheddable_at: span(&raw.sheddable_at),
        critical_at: span(&raw.critical_at),
    };
    Ok((cfg, spans))
}
