//! `[shedding]`: its lowering from TOML and its checks, for both front
//! ends (see [`SheddingConfig`]).

use std::time::Duration;

use toml::Spanned;

use super::schema::RawShedding;
use super::validate::{Span, Validator};
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

/// Every bound of the shedding settings.
pub(super) fn check(
    v: &Validator<'_>,
    c: &SheddingConfig,
    at: &SheddingSpans,
) -> Result<(), ConfigError> {
    if let Some(n) = c.max_in_flight {
        v.at_least_one("[shedding] max_in_flight", n, at.max_in_flight.clone())?;
    }
    let durations = [
        ("queue_delay_target", c.queue_delay_target, &at.target),
        ("queue_delay_interval", c.queue_delay_interval, &at.interval),
        ("fleet_signal_refresh", c.fleet_signal_refresh, &at.refresh),
        ("retry_after", c.retry_after, &at.retry_after),
    ];
    for (what, d, span) in durations {
        let what = format!("[shedding] {what}");
        v.longer_than_zero(&what, d, span.clone())?;
        v.not_too_long(&what, d, span.clone())?;
    }
    if c.queue_delay_interval <= c.queue_delay_target {
        return Err(v.err(
            at.interval.clone(),
            "[shedding] queue_delay_interval must be longer than queue_delay_target: \
             the delay must stay above target for a whole interval to count as overload",
        ));
    }
    v.whole_seconds(
        "[shedding] retry_after",
        c.retry_after,
        at.retry_after.clone(),
    )?;
    if !(c.sheddable_at > 0.0 && c.sheddable_at <= 1.0) {
        return Err(v.err(
            at.sheddable_at.clone(),
            format!(
                "[shedding] sheddable_at is {}; it must be above 0 and at most 1.0 \
                 (sheddable routes go before normal ones, which are shed at 1.0)",
                c.sheddable_at
            ),
        ));
    }
    if !(c.critical_at >= 1.0 && c.critical_at.is_finite()) {
        return Err(v.err(
            at.critical_at.clone(),
            format!(
                "[shedding] critical_at is {}; it must be a number of at least 1.0 \
                 (critical routes go after normal ones, which are shed at 1.0)",
                c.critical_at
            ),
        ));
    }
    Ok(())
}
