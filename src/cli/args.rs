//! The command line: clap's definitions of the commands and their flags.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use clap_complete::Shell;

/// Operate fleetlimit's state in Redis: validate a configuration, inspect or
/// reset a caller's buckets, sweep for keys without an expiry, set the
/// fleet-wide shedding signal, watch the fleet.
///
/// Exit status: 0 done, 1 failed (Redis unreachable...), 2 bad usage or
/// configuration.
#[derive(Parser, Debug)]
#[command(name = "fleetlimit", version, about, long_about = None)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Where the configuration and Redis are.
#[derive(Args, Debug)]
pub(crate) struct Target {
    /// The configuration file (TOML).
    #[arg(long, value_name = "FILE")]
    pub(crate) config: PathBuf,
    /// The Redis URL, instead of `REDIS_URL` or the configuration's.
    #[arg(long, value_name = "URL")]
    pub(crate) redis: Option<String>,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Serve Envoy's rate limit service (envoy.service.ratelimit.v3) and
    /// grpc.health.v1, deciding `[[descriptors]]` with the layer's steps
    /// (docs/rls.md). Reloads the file on SIGHUP; stops on SIGTERM.
    #[cfg(feature = "rls")]
    Rls {
        /// The configuration file (TOML).
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// The address to listen on (`127.0.0.1:0`: a free port, said on
        /// stdout).
        #[arg(long, value_name = "ADDR")]
        listen: std::net::SocketAddr,
    },
    /// Validate a configuration and print its routes and limits.
    CheckConfig {
        /// The configuration file (TOML).
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Show a caller's buckets: state, and when each key expires.
    Inspect {
        /// The caller's key value: an API key (raw), an account, an IP, or
        /// `ip|account`.
        key: String,
        /// Only this limit's bucket.
        #[arg(long, value_name = "NAME")]
        limit: Option<String>,
        #[command(flatten)]
        target: Target,
        /// One JSON object: {"buckets": [{limit, key, value, pttl, state,
        /// invalid, remaining}]}, names escaped as in the text.
        #[arg(long)]
        json: bool,
    },
    /// Delete a caller's buckets and tell every instance to forget its
    /// remembered refusals and leases of them.
    Reset {
        /// The caller's key value (as for `inspect`).
        key: String,
        /// Only this limit's bucket.
        #[arg(long, value_name = "NAME")]
        limit: Option<String>,
        #[command(flatten)]
        target: Target,
        /// One JSON object: {"deleted": N}.
        #[arg(long)]
        json: bool,
    },
    /// A limit's contract in words, the caller's bucket now, and the
    /// caller's recorded decisions (the limit needs `record = true`).
    Explain {
        /// The caller's key value (as for `inspect`).
        key: String,
        /// The limit to explain.
        #[arg(long, value_name = "NAME")]
        limit: String,
        #[command(flatten)]
        target: Target,
        /// The decisions of this long ago until now [default: 1h].
        #[arg(long, value_name = "DURATION", value_parser = duration, conflicts_with_all = ["from", "to"])]
        since: Option<Duration>,
        /// The decisions from this time (RFC 3339), with --to.
        #[arg(long, value_name = "TIME", requires = "to")]
        from: Option<String>,
        /// The decisions until this time (RFC 3339), with --from.
        #[arg(long, value_name = "TIME", requires = "from")]
        to: Option<String>,
        /// One JSON object: the limit, caller, plan, contract, state,
        /// scope (a global limit's share in this region) and every
        /// decision, fields escaped as in the text.
        #[arg(long)]
        json: bool,
    },
    /// Give fleetlimit's keys left without an expiry the one their limit
    /// sets; keys that are not fleetlimit's are listed, never touched.
    Sweep {
        #[command(flatten)]
        target: Target,
        /// Count only; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// The TTL of keys whose limit is not configured (with
        /// --include-unknown-limits) and of the heartbeat without discovery.
        #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = duration)]
        default_ttl: Duration,
        /// Also repair keys of limits the configuration no longer defines.
        #[arg(long)]
        include_unknown_limits: bool,
        /// One JSON object: {prefix, dry_run, scanned, before, repaired,
        /// after, keys, invalid, skipped: [{key, why}]}, every skipped key
        /// listed, names escaped as in the text.
        #[arg(long)]
        json: bool,
    },
    /// Set the fleet-wide load-shedding signal every instance with
    /// `[shedding]` reads (`1.2` sheds normal and sheddable routes, `0.9`
    /// sheddable ones only); `off` or `0` clears it.
    Shed {
        /// The pressure (a number ≥ 0), or `off`.
        #[arg(value_name = "PRESSURE")]
        pressure: String,
        /// How long it holds: it always expires.
        #[arg(long = "for", value_name = "DURATION", value_parser = duration)]
        duration: Option<Duration>,
        #[command(flatten)]
        target: Target,
    },
    /// Watch the fleet: live instances, per limit the sampled keys closest
    /// to exhaustion, and the refusals recorded per second.
    Top {
        #[command(flatten)]
        target: Target,
        /// Print one frame and exit.
        #[arg(long)]
        once: bool,
        /// Time between refreshes.
        #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = duration)]
        interval: Duration,
        /// Keys scanned per refresh at most (the SCAN page's COUNT).
        #[arg(long, value_name = "N", default_value_t = 1000)]
        sample: usize,
        /// Keys shown per limit.
        #[arg(long, value_name = "N", default_value_t = 5)]
        rows: usize,
        /// Refusals per second are counted over this last stretch of the
        /// decision records.
        #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration)]
        window: Duration,
        /// Each frame as one JSON object on one line (never clears the
        /// screen), names escaped as in the text.
        #[arg(long)]
        json: bool,
    },
    /// Print a completion script for a shell (`fleetlimit completions bash
    /// > /etc/bash_completion.d/fleetlimit`).
    Completions {
        /// The shell.
        shell: Shell,
    },
}

/// A duration as the configuration writes it (`90s`, `15min`, `1h`, `2d`).
pub(crate) fn duration(v: &str) -> Result<Duration, String> {
    crate::config::parse_duration(v).map_err(|e| e.to_string())
}
