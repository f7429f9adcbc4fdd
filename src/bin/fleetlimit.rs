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
//! fleetlimit top --config FILE [--redis URL] [--once] [--interval 1s]
//!                [--sample 1000] [--rows 5] [--window 10s]
//! fleetlimit completions SHELL
//! fleetlimit --help | --version | COMMAND --help
//! ```
//!
//! `explain` prints limit `NAME`'s contract for the caller in words, its
//! bucket now, and the caller's decisions recorded over the last hour
//! (`--since`) or between two RFC 3339 times, each refusal with the answer
//! before it and each degraded decision marked (the limit needs
//! `record = true`; see docs/operations.md, "Defending a 429").
//!
//! `top` shows what the fleet is doing, refreshed every `--interval`: the
//! live instances (the fleet heartbeat), per limit the keys exhausted or
//! closest to it among those sampled (one `SCAN` page of at most
//! `--sample` keys per refresh, at most 10,000, continued at the next;
//! on a limit with plans a key is shown under the base numbers, with the
//! most a plan would leave it), and the refusals per second recorded over
//! the last `--window` by limits with `record = true` (the latest 10,000
//! decisions at most). Plain text; the screen is cleared between refreshes
//! when stdout is a terminal. `--once` prints one frame and exits; without
//! it, 60 failed frames in a row exit 1.
//!
//! `shed` sets the fleet-wide load-shedding signal (`<prefix>:shed:{fleet}`)
//! every instance with `[shedding]` reads: `1.2` sheds normal and sheddable
//! routes, `0.9` sheddable ones only, `0` clears it. It always expires.
//!
//! `check-config` warns (on stderr, exit status 0) about a valid
//! configuration that limits nothing: no route entry and no `[default]`
//! names a limit, as an empty or truncated file.
//!
//! `inspect`, `reset`, `explain`, `sweep` and `top` take `--json`: one JSON
//! object (a line per frame for `top`), every key name and record field in
//! it escaped and bounded as in the text (`fleetlimit::admin::printable`).
//!
//! `KEY` is the caller's key value: an API key (raw, as clients send it: the
//! command computes the keyed digest Redis holds), an account, an IP,
//! `ip|account`, or what a custom key's extractor answers (a tenant; a
//! keyed digest too). `reset` deletes the caller's buckets and announces the
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

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand};
use clap_complete::Shell;
use fleetlimit::admin::{self, printable, Admin, TimeRange};
use fleetlimit::Config;

/// Skipped keys listed by `sweep`; the rest are counted.
const SKIPPED_SHOWN: usize = 100;

/// Operate fleetlimit's state in Redis: validate a configuration, inspect or
/// reset a caller's buckets, sweep for keys without an expiry, set the
/// fleet-wide shedding signal, watch the fleet.
///
/// Exit status: 0 done, 1 failed (Redis unreachable...), 2 bad usage or
/// configuration.
#[derive(Parser, Debug)]
#[command(name = "fleetlimit", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where the configuration and Redis are.
#[derive(Args, Debug)]
struct Target {
    /// The configuration file (TOML).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// The Redis URL, instead of `REDIS_URL` or the configuration's.
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
}

#[derive(Subcommand, Debug)]
enum Command {
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
        /// One JSON object: the limit, caller, plan, contract, state and
        /// every decision, fields escaped as in the text.
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
fn duration(v: &str) -> Result<Duration, String> {
    fleetlimit::parse_duration(v).map_err(|e| e.to_string())
}

fn load(t: &Target) -> Result<Config, String> {
    let mut cfg = Config::from_toml_file(&t.config).map_err(|e| e.to_string())?;
    let url = match &t.redis {
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
    // Usage errors exit 2 with clap's message; --help and --version exit 0.
    let cli = Cli::parse();
    match run(cli.command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, e)) => {
            eprintln!("fleetlimit: {e}");
            ExitCode::from(code)
        }
    }
}

async fn run(command: Command) -> Result<(), (u8, String)> {
    let usage = |e: String| (2, e);
    let failed = |e: fleetlimit::StoreError| (1, e.to_string());
    match command {
        Command::CheckConfig { file } => {
            let cfg = Config::from_toml_file(&file).map_err(|e| usage(e.to_string()))?;
            if cfg.limits_nothing() {
                // Valid, but what an empty or truncated file looks like.
                println!("{}: ok, but it limits nothing", file.display());
                eprintln!(
                    "fleetlimit: warning: {}: no [[routes]] entry and no [default] names a \
                     limit, so no request is limited (an empty or truncated file?)",
                    file.display()
                );
            } else {
                println!("{}: ok", file.display());
            }
            print!("{}", cfg.describe());
            Ok(())
        }
        Command::Inspect {
            key,
            limit,
            target,
            json,
        } => {
            let admin = connect(&target, &key, limit.as_deref()).await?;
            let buckets = admin
                .inspect(&key, limit.as_deref())
                .await
                .map_err(failed)?;
            if json {
                return write_json(&serde_json::json!({ "buckets": buckets }));
            }
            let mut out = String::new();
            for b in buckets {
                let ttl = match b.pttl {
                    -2 => "no key".to_owned(),
                    -1 => "NO EXPIRY (run `fleetlimit sweep`)".to_owned(),
                    ms => format!("expires in {} s", num(ms as f64 / 1000.0)),
                };
                out.push_str(&format!(
                    "{}  {}\n    {}; {ttl}\n",
                    printable(&b.limit),
                    printable(&b.key),
                    b.state
                ));
            }
            write_out(out.as_bytes())
        }
        Command::Reset {
            key,
            limit,
            target,
            json,
        } => {
            let admin = connect(&target, &key, limit.as_deref()).await?;
            let n = admin.reset(&key, limit.as_deref()).await.map_err(failed)?;
            if json {
                return write_json(&serde_json::json!({ "deleted": n }));
            }
            println!("reset: {n} key(s) deleted");
            Ok(())
        }
        Command::Explain {
            key,
            limit,
            target,
            since,
            from,
            to,
            json,
        } => {
            let range = match (since, from, to) {
                (Some(d), _, _) if d.is_zero() => {
                    return Err(usage("--since must be longer than 0s".into()));
                }
                (Some(d), _, _) => TimeRange::Since(d),
                (None, Some(from), Some(to)) => TimeRange::between(&from, &to).map_err(usage)?,
                _ => TimeRange::Since(Duration::from_secs(3600)),
            };
            let cfg = load(&target).map_err(usage)?;
            Admin::check_explain(&cfg, &key, &limit).map_err(usage)?;
            let admin = Admin::connect(&cfg).await.map_err(failed)?;
            let e = admin.explain(&key, &limit, range).await.map_err(failed)?;
            if json {
                return write_json(&e);
            }
            write_out(e.to_string().as_bytes())
        }
        Command::Sweep {
            target,
            dry_run,
            default_ttl,
            include_unknown_limits,
            json,
        } => {
            if default_ttl < Duration::from_secs(1) {
                // A TTL this short deletes the keys rather than repairs them.
                return Err(usage(format!(
                    "--default-ttl must be at least 1s (a shorter expiry deletes the keys \
                     rather than repairs them), not {}",
                    fleetlimit::format_duration(default_ttl)
                )));
            }
            let cfg = load(&target).map_err(usage)?;
            let admin = Admin::connect(&cfg).await.map_err(failed)?;
            let options = admin::SweepOptions {
                dry_run,
                default_ttl,
                include_unknown_limits,
            };
            let r = admin.sweep(&options).await.map_err(failed)?;
            if json {
                let mut v = serde_json::to_value(&r).map_err(|e| (1, e.to_string()))?;
                v["prefix"] = printable(cfg.key_prefix()).into();
                v["dry_run"] = dry_run.into();
                return write_json(&v);
            }
            // Every name is escaped and bounded: another application's key
            // cannot forge a line of this report (a cron reads it).
            let mut out = String::new();
            let mut line = |l: String| {
                out.push_str(&l);
                out.push('\n');
            };
            line(format!(
                "scanned: {} keys under \"{}\"",
                r.scanned,
                printable(cfg.key_prefix())
            ));
            line(format!(
                "skipped: {} (not fleetlimit's or of no configured limit; left untouched)",
                r.skipped.len()
            ));
            // Another application may keep many keys under the prefix.
            for k in r.skipped.iter().take(SKIPPED_SHOWN) {
                line(format!("  {}  ({})", printable(&k.key), k.why));
            }
            if r.skipped.len() > SKIPPED_SHOWN {
                line(format!(
                    "  ... and {} more",
                    r.skipped.len() - SKIPPED_SHOWN
                ));
            }
            line(format!("without expiry before: {}", r.before));
            for k in &r.keys {
                match r.invalid.contains(k) {
                    true => line(format!(
                        "  {}  (invalid state (taken as absent by the limiter))",
                        printable(k)
                    )),
                    false => line(format!("  {}", printable(k))),
                }
            }
            if dry_run {
                line("dry run: nothing changed".into());
            } else {
                line(format!("repaired: {}", r.repaired));
            }
            line(format!("without expiry after: {}", r.after));
            write_out(out.as_bytes())
        }
        Command::Shed {
            pressure,
            duration,
            target,
        } => {
            let pressure: f64 = match pressure.as_str() {
                "off" => 0.0,
                v => v
                    .parse()
                    .map_err(|_| usage(format!("cannot read the pressure {v:?}")))?,
            };
            let duration = duration.unwrap_or(Duration::ZERO);
            Admin::check_shed(pressure, duration).map_err(usage)?;
            let cfg = load(&target).map_err(usage)?;
            let admin = Admin::connect(&cfg).await.map_err(failed)?;
            let key = admin.shed(pressure, duration).await.map_err(failed)?;
            if pressure == 0.0 {
                println!(
                    "{key}: cleared; instances stop shedding within their fleet_signal_refresh"
                );
            } else {
                println!(
                    "{key} = {pressure} for {}; every instance reads it within its fleet_signal_refresh",
                    fleetlimit::format_duration(duration)
                );
            }
            Ok(())
        }
        Command::Top {
            target,
            once,
            interval,
            sample,
            rows,
            window,
            json,
        } => {
            if interval.is_zero() || window.is_zero() {
                return Err(usage(
                    "--interval and --window must be longer than 0s".into(),
                ));
            }
            if sample == 0 || rows == 0 {
                return Err(usage("--sample and --rows must be at least 1".into()));
            }
            // One SCAN page and one pipelined read per refresh, on the
            // production Redis: keep both small.
            if sample > MAX_SAMPLE {
                return Err(usage(format!("--sample is at most {MAX_SAMPLE}")));
            }
            let cfg = load(&target).map_err(usage)?;
            let admin = Admin::connect(&cfg).await.map_err(failed)?;
            let mut top = admin.top(admin::TopOptions {
                sample,
                rows,
                window,
            });
            if once {
                let frame = top.frame().await.map_err(failed)?;
                if json {
                    return write_json(&frame);
                }
                return write_out(frame.to_string().as_bytes());
            }
            top_loop(&mut top, interval, json).await
        }
        Command::Completions { shell } => {
            // Written whole, so a closed pipe (`| head`) is an error, not a panic.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "fleetlimit", &mut script);
            std::io::stdout()
                .write_all(&script)
                .map_err(|e| (1, format!("cannot write the completion script: {e}")))
        }
    }
}

/// `top --sample`: keys per SCAN page and per pipelined read, at most.
const MAX_SAMPLE: usize = 10_000;
/// `top` gives up (exit 1) after this many failed frames in a row.
const FAILED_FRAMES: u32 = 60;

/// Frames until interrupted (or stdout closes). A failed frame is shown as
/// such and the next refresh tries again (Redis may be restarting), up to
/// [`FAILED_FRAMES`] in a row.
async fn top_loop(
    top: &mut admin::Top,
    interval: Duration,
    json: bool,
) -> Result<(), (u8, String)> {
    let clear = std::io::stdout().is_terminal() && !json;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Each command has the admin connection's timeout; this bounds a frame.
    let most = interval.max(Duration::from_secs(10));
    let mut failed = 0;
    loop {
        tick.tick().await;
        let text = match tokio::time::timeout(most, top.frame()).await {
            Ok(Ok(frame)) if json => {
                failed = 0;
                serde_json::to_string(&frame).map_err(|e| (1, e.to_string()))?
            }
            Ok(Ok(frame)) => {
                failed = 0;
                frame.to_string()
            }
            Ok(Err(e)) => {
                failed += 1;
                let e = printable(&e.to_string());
                match json {
                    true => serde_json::json!({ "error": e }).to_string(),
                    false => format!("fleetlimit top: {e}; trying again\n"),
                }
            }
            Err(_) => {
                failed += 1;
                let e = format!("no frame within {}", fleetlimit::format_duration(most));
                match json {
                    true => serde_json::json!({ "error": e }).to_string(),
                    false => format!("fleetlimit top: {e}; trying again\n"),
                }
            }
        };
        if failed >= FAILED_FRAMES {
            return Err((
                1,
                format!("no frame in {FAILED_FRAMES} refreshes in a row; giving up"),
            ));
        }
        let text = if clear {
            format!("\x1b[2J\x1b[H{text}")
        } else {
            text + "\n"
        };
        if write_out(text.as_bytes()).is_err() {
            // Stdout closed (`| head`): done.
            return Ok(());
        }
    }
}

/// `value` as one line of JSON on stdout.
fn write_json(value: &impl serde::Serialize) -> Result<(), (u8, String)> {
    let mut text = serde_json::to_string(value).map_err(|e| (1, e.to_string()))?;
    text.push('\n');
    write_out(text.as_bytes())
}

/// Seconds for people: at most 3 decimals, no trailing zeros.
fn num(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// Writes to stdout: a closed pipe is an error, not a panic.
fn write_out(text: &[u8]) -> Result<(), (u8, String)> {
    let mut out = std::io::stdout().lock();
    out.write_all(text)
        .and_then(|()| out.flush())
        .map_err(|e| (1, format!("cannot write to stdout: {e}")))
}

/// A connection, once the key is checked against the configuration.
async fn connect(target: &Target, key: &str, limit: Option<&str>) -> Result<Admin, (u8, String)> {
    let cfg = load(target).map_err(|e| (2, e))?;
    Admin::check_target(&cfg, key, limit).map_err(|e| (2, e))?;
    Admin::connect(&cfg).await.map_err(|e| (1, e.to_string()))
}
