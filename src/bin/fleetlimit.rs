//! `fleetlimit`: validate a configuration, inspect or reset a caller's
//! buckets, and sweep for keys left without an expiry.
//!
//! ```text
//! fleetlimit check-config FILE
//! fleetlimit inspect KEY [--limit NAME] --config FILE [--redis URL]
//! fleetlimit reset KEY [--limit NAME] --config FILE [--redis URL]
//! fleetlimit explain KEY --limit NAME --config FILE [--redis URL]
//!                    [--since DURATION | --from TIME --to TIME]
//! fleetlimit sweep --config FILE [--redis URL] [--dry-run] [--default-ttl 1h]
//!                  [--include-unknown-limits]
//! fleetlimit shed PRESSURE --for DURATION --config FILE [--redis URL]
//! ```
//!
//! `explain` prints limit `NAME`'s contract for the caller in words, its
//! bucket now, and the caller's decisions recorded over the last hour
//! (`--since`) or between two RFC 3339 times, each refusal with the answer
//! before it and each degraded decision marked (the limit needs
//! `record = true`; see docs/operations.md, "Defending a 429").
//!
//! `shed` sets the fleet-wide load-shedding signal (`<prefix>:shed:{fleet}`)
//! every instance with `[shedding]` reads: `1.2` sheds normal and sheddable
//! routes, `0.9` sheddable ones only, `0` clears it. It always expires.
//!
//! `KEY` is the caller's key value: an API key (raw, as clients send it: the
//! command computes the keyed digest Redis holds), an account, an IP, or
//! `ip|account`. `reset` deletes the caller's buckets and announces the
//! reset on `<prefix>:reset`: every layer instance listening there forgets
//! its remembered refusals and leases of those keys within a second (one
//! that was disconnected forgets all of them when it listens again; see
//! docs/operations.md, "Resetting a caller: reach"). The Redis URL comes
//! from `--redis`, else `REDIS_URL`, else
//! the configuration; it may be `redis://`, `redis-sentinel://` or
//! `redis-cluster://`, each also as `rediss…` (TLS), or `redis+unix://`
//! (a Unix socket). The sweep touches only fleetlimit's own keys (by name
//! and type) and lists the others under the prefix as skipped.
//! Exit status: 0 done, 1 failed, 2 bad usage or config (a bad URL included).

use std::process::ExitCode;
use std::time::Duration;

use fleetlimit::admin::{self, Admin, TimeRange};
use fleetlimit::Config;

const USAGE: &str = "usage:
  fleetlimit check-config FILE
  fleetlimit inspect KEY [--limit NAME] --config FILE [--redis URL]
  fleetlimit reset KEY [--limit NAME] --config FILE [--redis URL]
  fleetlimit explain KEY --limit NAME --config FILE [--redis URL]
                     [--since DURATION | --from TIME --to TIME]
  fleetlimit sweep --config FILE [--redis URL] [--dry-run] [--default-ttl DURATION]
                   [--include-unknown-limits]
  fleetlimit shed PRESSURE --for DURATION --config FILE [--redis URL]";

/// Skipped keys listed by `sweep`; the rest are counted.
const SKIPPED_SHOWN: usize = 100;

struct Args {
    command: String,
    positional: Vec<String>,
    config: Option<String>,
    redis: Option<String>,
    limit: Option<String>,
    dry_run: bool,
    default_ttl: Duration,
    include_unknown_limits: bool,
    /// `shed --for`.
    shed_for: Option<Duration>,
    /// `explain --since`, `--from`, `--to`.
    since: Option<Duration>,
    from: Option<String>,
    to: Option<String>,
}

fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let command = argv.next().ok_or("no command")?;
    let mut a = Args {
        command,
        positional: Vec::new(),
        config: None,
        redis: None,
        limit: None,
        dry_run: false,
        default_ttl: Duration::from_secs(3600),
        include_unknown_limits: false,
        shed_for: None,
        since: None,
        from: None,
        to: None,
    };
    while let Some(arg) = argv.next() {
        let mut value = |name: &str| argv.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--config" => a.config = Some(value("--config")?),
            "--redis" => a.redis = Some(value("--redis")?),
            "--limit" => a.limit = Some(value("--limit")?),
            "--dry-run" => a.dry_run = true,
            "--include-unknown-limits" => a.include_unknown_limits = true,
            "--default-ttl" => {
                let v = value("--default-ttl")?;
                a.default_ttl =
                    parse_secs(&v).ok_or(format!("--default-ttl: cannot read {v:?}"))?;
                if a.default_ttl.is_zero() {
                    // A zero TTL would delete the keys, not repair them.
                    return Err(format!("--default-ttl must be longer than 0s, not {v:?}"));
                }
            }
            "--for" => {
                let v = value("--for")?;
                a.shed_for = Some(parse_secs(&v).ok_or(format!("--for: cannot read {v:?}"))?);
            }
            "--since" => {
                let v = value("--since")?;
                let d = parse_secs(&v).ok_or(format!(
                    "--since: cannot read {v:?} (a duration such as 90s, 15min, 1h, 2d)"
                ))?;
                if d.is_zero() {
                    return Err(format!("--since must be longer than 0s, not {v:?}"));
                }
                a.since = Some(d);
            }
            "--from" => a.from = Some(value("--from")?),
            "--to" => a.to = Some(value("--to")?),
            "-h" | "--help" => return Err(String::new()),
            s if s.starts_with("--") => return Err(format!("unknown option {s}")),
            _ => a.positional.push(arg),
        }
    }
    Ok(a)
}

/// `90s`, `15min`, `1h`, `2d` → a duration (the units the config accepts).
fn parse_secs(v: &str) -> Option<Duration> {
    let split = v.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = v.split_at(split);
    let n: u64 = n.parse().ok()?;
    let secs = match unit {
        "s" => 1,
        "m" | "min" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return None,
    };
    // Checked: an absurd number is an error, not a wrapped duration.
    Some(Duration::from_secs(n.checked_mul(secs)?))
}

fn load(a: &Args) -> Result<Config, String> {
    let path = a.config.as_deref().ok_or("--config FILE is required")?;
    let mut cfg = Config::from_toml_file(path).map_err(|e| e.to_string())?;
    let url = match &a.redis {
        Some(url) => Some(("--redis", url.clone())),
        None => std::env::var("REDIS_URL")
            .ok()
            .map(|url| ("REDIS_URL", url)),
    };
    if let Some((source, url)) = url {
        cfg = cfg
            .try_with_redis_url(url)
            .map_err(|e| format!("{source}: {e}"))?;
    }
    Ok(cfg)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("fleetlimit: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, e)) => {
            eprintln!("fleetlimit: {e}");
            ExitCode::from(code)
        }
    }
}

async fn run(a: Args) -> Result<(), (u8, String)> {
    let usage = |e: String| (2, e);
    let failed = |e: fleetlimit::StoreError| (1, e.to_string());
    match a.command.as_str() {
        "check-config" => {
            let path = a
                .positional
                .first()
                .or(a.config.as_ref())
                .ok_or_else(|| usage("check-config FILE".into()))?;
            let cfg = Config::from_toml_file(path).map_err(|e| usage(e.to_string()))?;
            println!("{path}: ok");
            print!("{}", cfg.describe());
            Ok(())
        }
        "inspect" | "reset" => {
            let key = a
                .positional
                .first()
                .ok_or_else(|| usage(format!("{} KEY", a.command)))?;
            let cfg = load(&a).map_err(usage)?;
            Admin::check_target(&cfg, key, a.limit.as_deref()).map_err(usage)?;
            let admin = Admin::connect(&cfg).await.map_err(failed)?;
            if a.command == "inspect" {
                for b in admin
                    .inspect(key, a.limit.as_deref())
                    .await
                    .map_err(failed)?
                {
                    let ttl = match b.pttl {
                        -2 => "no key".to_owned(),
                        -1 => "NO EXPIRY (run `fleetlimit sweep`)".to_owned(),
                        ms => format!("expires in {:.3} s", ms as f64 / 1000.0),
                    };
                    println!("{}  {}\n    {}; {ttl}", b.limit, b.key, b.state);
                }
            } else {
                let n = admin.reset(key, a.limit.as_deref()).await.map_err(failed)?;
                println!("reset: {n} key(s) deleted");
            }
            Ok(())
        }
        "explain" => {
            let key = a
                .positional
                .first()
                .ok_or_else(|| usage("explain KEY --limit NAME --config FILE".into()))?;
            let limit = a
                .limit
                .as_deref()
                .ok_or_else(|| usage("explain needs --limit NAME".into()))?;
            let range = match (a.since, &a.from, &a.to) {
                (None, None, None) => TimeRange::Since(Duration::from_secs(3600)),
                (Some(d), None, None) => TimeRange::Since(d),
                (None, Some(from), Some(to)) => TimeRange::between(from, to).map_err(usage)?,
                (None, _, _) => return Err(usage("--from and --to go together".into())),
                (Some(_), _, _) => return Err(usage("--since or --from/--to, not both".into())),
            };
            let cfg = load(&a).map_err(usage)?;
            Admin::check_explain(&cfg, key, limit).map_err(usage)?;
            let admin = Admin::connect(&cfg).await.map_err(failed)?;
            let e = admin.explain(key, limit, range).await.map_err(failed)?;
            print!("{e}");
            Ok(())
        }
        "sweep" => {
            let cfg = load(&a).map_err(usage)?;
            let admin = Admin::connect(&cfg).await.map_err(failed)?;
            let options = admin::SweepOptions {
                dry_run: a.dry_run,
                default_ttl: a.default_ttl,
                include_unknown_limits: a.include_unknown_limits,
            };
            let r = admin.sweep(&options).await.map_err(failed)?;
            println!("scanned: {} keys under {:?}", r.scanned, cfg.key_prefix());
            println!(
                "skipped: {} (not fleetlimit's or of no configured limit; left untouched)",
                r.skipped.len()
            );
            // Another application may keep many keys under the prefix.
            for k in r.skipped.iter().take(SKIPPED_SHOWN) {
                println!("  {}  ({})", k.key, k.why);
            }
            if r.skipped.len() > SKIPPED_SHOWN {
                println!("  ... and {} more", r.skipped.len() - SKIPPED_SHOWN);
            }
            println!("without expiry before: {}", r.before);
            for k in &r.keys {
                println!("  {k}");
            }
            if a.dry_run {
                println!("dry run: nothing changed");
            } else {
                println!("repaired: {}", r.repaired);
            }
            println!("without expiry after: {}", r.after);
            Ok(())
        }
        "shed" => {
            let value = a
                .positional
                .first()
                .ok_or_else(|| usage("shed PRESSURE --for DURATION".into()))?;
            let pressure: f64 = match value.as_str() {
                "off" => 0.0,
                v => v
                    .parse()
                    .map_err(|_| usage(format!("cannot read the pressure {v:?}")))?,
            };
            let duration = a.shed_for.unwrap_or(Duration::ZERO);
            Admin::check_shed(pressure, duration).map_err(usage)?;
            let cfg = load(&a).map_err(usage)?;
            let admin = Admin::connect(&cfg).await.map_err(failed)?;
            let key = admin.shed(pressure, duration).await.map_err(failed)?;
            if pressure == 0.0 {
                println!(
                    "{key}: cleared; instances stop shedding within their fleet_signal_refresh"
                );
            } else {
                println!(
                    "{key} = {pressure} for {} s; every instance reads it within its fleet_signal_refresh",
                    duration.as_secs()
                );
            }
            Ok(())
        }
        other => Err(usage(format!("unknown command {other:?}\n{USAGE}"))),
    }
}
