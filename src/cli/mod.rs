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
//! fleetlimit rls --config FILE --listen ADDR      (feature `rls`)
//! fleetlimit completions SHELL
//! fleetlimit --help | --version | COMMAND --help
//! ```
//!
//! `explain` prints limit `NAME`'s contract for the caller in words, its
//! bucket now, and the caller's decisions recorded over the last hour
//! (`--since`) or between two RFC 3339 times, each refusal with the answer
//! before it and each degraded decision marked (the limit needs
//! `record = true`; see docs/operations.md, "Defending a 429"). For a
//! global limit (`scope = "global"`) it also prints this region's share of
//! the key (read from the region's Redis) and reads the bucket under it,
//! as `inspect` does, with the quota in flight to and from each region and
//! the last exchange with each (docs/regions.md, "Seeing the quota").
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
//! it escaped and bounded as in the text (`admin::printable`).
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

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser};

use crate::Config;
use crate::admin::{self, Admin, TimeRange, printable};
use crate::config::format_duration;

mod args;
mod top;

use args::{Cli, Command, Target};
use top::{MAX_SAMPLE, top_loop};

/// Skipped keys listed by `sweep`; the rest are counted.
const SKIPPED_SHOWN: usize = 100;

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

/// Runs the `fleetlimit` command on this process's arguments, as the
/// binary does (`cargo install fleetlimit --features cli`): its commands,
/// flags and output are documented by `fleetlimit --help`.
pub fn main() -> ExitCode {
    // Usage errors exit 2 with clap's message; --help and --version exit 0.
    let cli = Cli::parse();
    // A server uses every core; the other commands are one conversation.
    #[cfg(feature = "rls")]
    let mut builder = match cli.command {
        Command::Rls { .. } => tokio::runtime::Builder::new_multi_thread(),
        _ => tokio::runtime::Builder::new_current_thread(),
    };
    #[cfg(not(feature = "rls"))]
    let mut builder = tokio::runtime::Builder::new_current_thread();
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fleetlimit: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, e)) => {
            eprintln!("fleetlimit: {e}");
            ExitCode::from(code)
        }
    }
}

async fn run(command: Command) -> Result<(), (u8, String)> {
    let usage = |e: String| (2, e);
    let failed = |e: crate::StoreError| (1, e.to_string());
    match command {
        #[cfg(feature = "rls")]
        Command::Rls { config, listen } => crate::rls::serve(&config, listen).await,
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
                out.push_str(&admin::global_words(&b));
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
                    format_duration(default_ttl)
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
                    format_duration(duration)
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
pub(crate) fn write_out(text: &[u8]) -> Result<(), (u8, String)> {
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
