//! `[shedding]` checked: every bound, from code or from TOML.

use super::{Place, Validator};
use crate::config::ConfigError;
use crate::shed::SheddingConfig;

impl Validator<'_> {
    /// Every bound of the shedding settings.
    pub(in crate::config) fn shedding(&self, c: &SheddingConfig) -> Result<(), ConfigError> {
        let v = self;
        let at = |field: &str| Place::of(&["shedding", field]);
        if let Some(n) = c.max_in_flight {
            v.at_least_one("[shedding] max_in_flight", n, at("max_in_flight"))?;
        }
        let durations = [
            ("queue_delay_target", c.queue_delay_target),
            ("queue_delay_interval", c.queue_delay_interval),
            ("fleet_signal_refresh", c.fleet_signal_refresh),
            ("retry_after", c.retry_after),
        ];
        for (field, d) in durations {
            let what = format!("[shedding] {field}");
            v.longer_than_zero(&what, d, at(field))?;
            v.not_too_long(&what, d, at(field))?;
        }
        if c.queue_delay_interval <= c.queue_delay_target {
            return Err(v.err(
                at("queue_delay_interval"),
                "[shedding] queue_delay_interval must be longer than queue_delay_target: \
             the delay must stay above target for a whole interval to count as overload",
            ));
        }
        v.whole_seconds("[shedding] retry_after", c.retry_after, at("retry_after"))?;
        if !(c.sheddable_at > 0.0 && c.sheddable_at <= 1.0) {
            return Err(v.err(
                at("sheddable_at"),
                format!(
                    "[shedding] sheddable_at is {}; it must be above 0 and at most 1.0 \
                 (sheddable routes go before normal ones, which are shed at 1.0)",
                    c.sheddable_at
                ),
            ));
        }
        if !(c.critical_at >= 1.0 && c.critical_at.is_finite()) {
            return Err(v.err(
                at("critical_at"),
                format!(
                    "[shedding] critical_at is {}; it must be a number of at least 1.0 \
                 (critical routes go after normal ones, which are shed at 1.0)",
                    c.critical_at
                ),
            ));
        }
        Ok(())
    }
}
