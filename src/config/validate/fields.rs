//! What only a file can write wrong: fields that need another one, and a
//! limit's (or a plan's) numbers that its algorithm has no use for or
//! lacks. The builder's types cannot say these, so only the TOML loader
//! asks, through `lower/`.

use super::Span;
use crate::config::schema::Exceed;
use crate::config::ConfigError;

/// `[fleet] heartbeat` or `dead_after` (`written`: the first of them).
pub(in crate::config) fn heartbeat(
    src: &str,
    discover: bool,
    written: Span,
) -> Result<(), ConfigError> {
    needs(
        src,
        discover,
        written,
        "heartbeat settings need `discover = true`",
    )
}

/// `lease_above` (at `above`) needs `lease_batch`.
pub(in crate::config) fn lease(src: &str, batch: bool, above: Span) -> Result<(), ConfigError> {
    needs(src, batch, above, "lease_above needs lease_batch")
}

/// Limit `name`'s `failure_statuses` (at `statuses`) need
/// `count = "failures"`.
pub(in crate::config) fn failure_statuses(
    src: &str,
    name: &str,
    counts_failures: bool,
    statuses: Span,
) -> Result<(), ConfigError> {
    let m = format!("limit {name:?}: `failure_statuses` needs `count = \"failures\"`");
    needs(src, counts_failures, statuses, m)
}

/// A field, if `written`, needs what `present` says is there.
fn needs(
    src: &str,
    present: bool,
    written: Span,
    message: impl Into<String>,
) -> Result<(), ConfigError> {
    match written {
        Some(at) if !present => Err(ConfigError::at(src, Some(at), message)),
        _ => Ok(()),
    }
}

/// Limit `name`'s `on_exceed = "delay"` and `delay`: each needs the other.
pub(in crate::config) fn delay(
    src: &str,
    name: &str,
    exceed: Option<Exceed>,
    on_exceed: Span,
    delay: Span,
) -> Result<(), ConfigError> {
    match (exceed, delay) {
        (Some(Exceed::Delay), None) => Err(limit_err(
            src,
            name,
            on_exceed,
            "`on_exceed = \"delay\"` needs `delay`, how long to hold a request (e.g. \"2s\")",
        )),
        (Some(Exceed::Delay), Some(_)) | (_, None) => Ok(()),
        (_, Some(at)) => Err(limit_err(
            src,
            name,
            Some(at),
            "`delay` needs `on_exceed = \"delay\"`",
        )),
    }
}

/// Limit `name`'s `field`, written (at `written`) for an algorithm without
/// it (`algorithm`: what to call it, with a hint).
pub(in crate::config) fn not_for(
    src: &str,
    name: &str,
    field: &str,
    written: Span,
    algorithm: &str,
) -> Result<(), ConfigError> {
    written.map_or(Ok(()), |at| {
        Err(ConfigError::at(
            src,
            Some(at),
            format!("limit {name:?}: `{field}` does not apply to a {algorithm}"),
        ))
    })
}

/// Limit `name`'s `field`, which its algorithm needs and nothing gave
/// (`at`: the limit's table).
pub(in crate::config) fn missing(src: &str, name: &str, field: &str, at: Span) -> ConfigError {
    ConfigError::at(src, at, format!("limit {name:?}: missing `{field}`"))
}

fn limit_err(src: &str, name: &str, at: Span, m: &str) -> ConfigError {
    ConfigError::at(src, at, format!("limit {name:?}: {m}"))
}

/// `[regions]` names this instance's region by `this` or `this_env`:
/// `both` written (at `this_env`), or neither (at the table).
pub(in crate::config) fn this_region(src: &str, at: Span, both: bool) -> ConfigError {
    let m = if both {
        "[regions] takes `this` or `this_env`, not both: this instance's region is named once"
    } else {
        "[regions] needs `this` (this instance's region, e.g. this = \"eu\") or `this_env` \
         (the environment variable naming it, e.g. this_env = \"FLEETLIMIT_REGION\")"
    };
    ConfigError::at(src, at, m)
}

/// Limit `name`'s `split` (at `split`) needs `scope = "global"`.
pub(in crate::config) fn split(
    src: &str,
    name: &str,
    global: bool,
    split: Span,
) -> Result<(), ConfigError> {
    let m = format!(
        "limit {name:?}: `split` needs `scope = \"global\"` (it shares a global limit \
         between regions)"
    );
    needs(src, global, split, m)
}
