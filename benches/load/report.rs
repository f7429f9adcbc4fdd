//! The tables, the report they are written to (`docs/bench/load.md`, whole)
//! and the section of `docs/benchmarks.md` that sums the run up.

use std::fmt::Write as _;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::contenders::{BARE, Contender, PEER};
use crate::figures::{opt, thousands};
use crate::knobs::{CONNECTIONS, DEADLINE_MS, DEFAULT_SECS, POOL_SIZE, ROUNDS, WARMUP};
use crate::scenarios::{Measured, Scenario};
use crate::scripts::ScriptRow;

pub const DOCS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/benchmarks.md");
/// Every table of a full run, the file written whole (no markers).
pub const REPORT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/bench/load.md");
pub const BEGIN: &str = "<!-- load:begin -->";
pub const END: &str = "<!-- load:end -->";

pub fn scenario_table(sc: &Scenario, rows: &[Measured]) -> String {
    let rps_of = |c: Contender| {
        rows.iter()
            .find(|r| r.contender == c)
            .map(|r| r.stats.rps)
            .filter(|v| *v > 0.0)
    };
    let baseline = rps_of(sc.baseline);
    let peer = rps_of(PEER);
    let ratio = |x: f64, base: Option<f64>| opt(base.map(|b| x / b), 2);

    let mut head = vec![
        "contender".to_owned(),
        "req/s".to_owned(),
        "p50 µs".to_owned(),
        "p99 µs".to_owned(),
        "429 share".to_owned(),
        format!("req/s ÷ {}", sc.baseline.name()),
    ];
    if peer.is_some() {
        head.push("req/s ÷ tower-rate-limit-fred".to_owned());
    }
    head.push("server CPU µs/req".to_owned());
    head.push("Redis CPU µs/req".to_owned());
    if sc.count_scripts {
        head.push("script calls/s".to_owned());
        head.push("script calls per request".to_owned());
    }
    head.push("busy % of a core: server / generator / Redis".to_owned());
    head.push("errors + other statuses".to_owned());

    let mut t = format!("| {} |\n|---|", head.join(" | "));
    t.push_str(&"--:|".repeat(head.len() - 1));
    t.push('\n');
    let mut notes = String::new();
    for r in rows {
        let s = &r.stats;
        let mut cells = vec![
            r.contender.name().to_owned(),
            thousands(s.rps),
            s.p50_us.to_string(),
            s.p99_us.to_string(),
            format!("{:.1} %", s.share_429 * 100.0),
            ratio(s.rps, baseline),
        ];
        if peer.is_some() {
            cells.push(if r.contender == BARE {
                "—".to_owned()
            } else {
                ratio(s.rps, peer)
            });
        }
        cells.push(opt(r.cpu.server_us_per_req, 1));
        cells.push(if r.contender.uses_redis() {
            opt(r.cpu.redis_us_per_req, 1)
        } else {
            "—".to_owned()
        });
        if sc.count_scripts {
            cells.push(
                r.script_calls_per_sec
                    .map_or_else(|| "—".to_owned(), thousands),
            );
            cells.push(opt(r.script_calls_per_sec.map(|c| c / s.rps.max(1e-9)), 2));
        }
        cells.push(r.cpu.busy());
        cells.push((s.errors + s.other).to_string());
        let _ = writeln!(t, "| {} |", cells.join(" | "));
        if !r.note.is_empty() {
            let _ = writeln!(notes, "- {}: {}.", r.contender.name(), r.note);
        }
    }
    if !notes.is_empty() {
        let _ = write!(t, "\nIn the reported run:\n\n{notes}");
    }
    let generator_bound: Vec<&str> = rows
        .iter()
        .filter(|r| r.cpu.generator_busy.is_some_and(|b| b >= 0.9))
        .map(|r| r.contender.name())
        .collect();
    if !generator_bound.is_empty() {
        let _ = write!(
            t,
            "\nThe load generator kept ≥ 90 % of a core busy for: {}. Their req/s is \
             (close to) the generator's ceiling, not their server's, so their req/s \
             ratios say little; compare their server CPU µs/req instead.\n",
            generator_bound.join(", ")
        );
    }
    t
}

pub fn script_table(rows: &[ScriptRow]) -> String {
    let reference = rows
        .first()
        .map(|r| r.us_per_call)
        .filter(|v| v.is_finite());
    let num = |v: f64| {
        if v.is_finite() {
            format!("{v:.2}")
        } else {
            "—".to_owned()
        }
    };
    let mut t = String::from(
        "| script | µs of Redis CPU per call | µs per decision | decision ÷ reference token bucket | redis-benchmark calls/s |\n\
         |---|--:|--:|--:|--:|\n",
    );
    let mut notes = String::new();
    for r in rows {
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} |",
            r.name,
            num(r.us_per_call),
            num(r.us_per_call / r.batch as f64),
            reference.map_or_else(
                || "—".to_owned(),
                |b| num(r.us_per_call / r.batch as f64 / b)
            ),
            r.bench_rps.map_or_else(|| "—".to_owned(), thousands)
        );
        if !r.note.is_empty() {
            let _ = writeln!(notes, "- {}: {}.", r.name, r.note);
        }
    }
    if !notes.is_empty() {
        let _ = write!(t, "\n{notes}");
    }
    t
}

/// What the docs say about the run itself.
pub struct RunInfo {
    pub secs: Duration,
    pub elapsed: Duration,
    pub load_before: String,
    pub load_after: String,
    pub revision: String,
    pub date: String,
}

/// The section of `docs/benchmarks.md` between the markers: the run, the
/// goals of the last three runs and the charts; every table of the run is
/// in the report (`REPORT`), which it links.
pub fn docs_section(run: &RunInfo, goals: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{BEGIN}");
    let _ = writeln!(
        s,
        "## Load (HTTP, side by side)\n\n\
         Written by `benches/load/`, which rewrites this section (up to the end \
         marker) and writes every scenario's table to [bench/load.md](bench/load.md) \
         on every run of\n\n\
         ```sh\n\
         cargo bench --bench load\n\
         ```\n\n\
         Each contender is an axum server on one worker thread, driven over \
         keep-alive HTTP/1.1 by a load generator in the same process, with its \
         own `redis-server`; the report says how each figure is taken.\n"
    );
    s.push_str(&this_run(run, "###"));
    let _ = writeln!(
        s,
        "### Goals of issue 15, the last three runs\n\n\
         Each goal must hold in three consecutive full runs. The figures of every full \
         run are appended to `docs/bench/runs.tsv` (the last 10 kept); the columns are \
         the last three, this run last. Sources: scenarios (a), (b), (f), (g), (h) and \
         the in-process and script sections of [the report](bench/load.md).\n\n{goals}"
    );
    let mut s = s.trim_end().to_owned();
    let _ = writeln!(s, "\n\n{END}");
    s
}

/// The whole of `docs/bench/load.md`: how the run measures, the run, and
/// every table.
pub fn report(run: &RunInfo, scenarios: &str, scripts: Option<&str>) -> String {
    let RunInfo { secs, .. } = run;
    let mut s = String::from(
        "# Load: every scenario\n\n\
         Written whole by `cargo bench --bench load` on every run; the goals and \
         the charts are in [docs/benchmarks.md](../benchmarks.md#load-http-side-by-side).\n\n",
    );
    let _ = writeln!(
        s,
        "## How it is measured\n\n\
         `LOAD_SECS` sets the recorded seconds per run: {} s by default, short \
         so that one run, every scenario below included, takes under 6 minutes \
         (`LOAD_ONLY=scripts` measures the script costs alone). A run starts its \
         own `redis-server`; each contender is an axum server (route `/`, handler \
         `\"ok\"`, `into_make_service_with_connect_info::<SocketAddr>()`) on a tokio \
         runtime with **one** worker thread, driven by an in-process Rust load \
         generator on one current-thread runtime (like `wrk -t1 -c{CONNECTIONS}`): \
         {CONNECTIONS} keep-alive HTTP/1.1 connections sending `GET /` with an \
         `x-api-key` header back to back. Every limiter is keyed by that header and \
         given the same numbers (fleetlimit: `header:x-api-key` token bucket; \
         tower-rate-limit-fred and tower_governor: GCRA with burst = capacity and \
         emission interval = 1 / refill rate). On Redis, fleetlimit has `[redis] \
         pool_size = {POOL_SIZE}, deadline = \"{DEADLINE_MS}ms\"` and \
         tower-rate-limit-fred a fred pool of {POOL_SIZE} with \
         `default_command_timeout` = {DEADLINE_MS} ms and `fail_open(true)`; both \
         pools run on the server's one worker thread. Requests are recorded from \
         the end of a {} s warm-up for {} s; the contenders run in turn, then in \
         the reverse order, and each one's better round (more requests per \
         second) is reported. Latency is client-side, from writing the request to \
         the end of the response body. `server CPU µs/req` is the CPU time of the \
         server's threads (`/proc/self/task/*/schedstat`) over the recorded \
         seconds ÷ the requests answered in them, `Redis CPU µs/req` the same for \
         `redis-server`, and `busy %` the share of one core that the server, the \
         generator and Redis kept busy (a server near 100 % is the bottleneck; a \
         generator near 100 % with a server well below it means the generator \
         is). Server, generator and Redis share the machine's two cores with \
         whatever else runs on it, so requests per second move from run to run; \
         CPU per request moves less. Read the ratios and the CPU figures rather \
         than the absolute rates. Latency percentiles are nearest-rank over every \
         recorded request.\n",
        DEFAULT_SECS,
        WARMUP.as_secs(),
        secs.as_secs_f64()
    );
    s.push_str(&this_run(run, "##"));
    s.push_str("## Every table\n\n");
    s.push_str(scenarios);
    s.push_str("### Redis CPU per script call\n\n");
    match scripts {
        Some(table) => {
            let _ = writeln!(
                s,
                "`redis-benchmark -P 16 -n <100,000 ÷ limits decided per call, at least 10,000> \
                 -r 10000` (50 clients) sending \
                 `EVALSHA <sha> 1 <key with __rand_int__> <args>` of each script \
                 (`SCRIPT LOAD`ed first, every key space empty before), on the same \
                 `redis-server`; µs per call is `usec` ÷ `calls` of `cmdstat_evalsha` \
                 in `INFO commandstats` after `CONFIG RESETSTAT`: Redis's own time for \
                 the whole script, its inner commands included. Every check is one \
                 bucket of burst 1000 refilled at 1000/s, cost 1 (fleetlimit's lean \
                 script takes them as 1000 µs per token and 1,000,000 µs of burst). \
                 The lean script is measured with 1, 4 and 16 checks per call \
                 (`EVALSHA <sha> <n> <key>×n <args>×n`, as the layer sends when n \
                 checks are in flight together; every `__rand_int__` is drawn on its \
                 own): its µs per decision is per call ÷ n (scenario (a) above shows how \
                 many checks the layer's calls carried: 1 ÷ script calls per request). \
                 Three rounds in alternating order; the table keeps each script's \
                 lowest figure, and the goals compare two scripts round by round (the \
                 median of the three ratios), so a busy or quiet moment of the machine \
                 weighs on both.\n\n{table}"
            );
        }
        None => {
            s.push_str("Skipped: `redis-benchmark` (Debian package redis-tools) was not found.\n")
        }
    }
    let mut s = s.trim_end().to_owned();
    s.push('\n');
    s
}

/// When, where and at which commit the run was made.
fn this_run(run: &RunInfo, heading: &str) -> String {
    let RunInfo {
        secs,
        elapsed,
        load_before,
        load_after,
        revision,
        date,
    } = run;
    let mut s = String::new();
    let _ = writeln!(s, "{heading} This run\n");
    let _ = writeln!(s, "- date: {date} (UTC)");
    let _ = writeln!(
        s,
        "- machine: `nproc` = {}, CPU {}; load average {load_before} before the run, \
         {load_after} after it; harness niceness {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model(),
        niceness()
    );
    let _ = writeln!(s, "- `{}`", command_line("rustc", &["--version"]));
    let _ = writeln!(s, "- `{}`", command_line("redis-server", &["--version"]));
    let _ = writeln!(s, "- fleetlimit at {revision}");
    let _ = writeln!(
        s,
        "- {CONNECTIONS} connections, {} s warm-up + {} s recorded per run, {ROUNDS} \
         rounds per scenario; the whole run took {:.0} s\n",
        WARMUP.as_secs(),
        secs.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    s
}

pub fn write_docs(section: &str) {
    let old = std::fs::read_to_string(DOCS).unwrap_or_default();
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if e > b => {
            let after = &old[e + END.len()..];
            format!("{}{}{}", &old[..b], section.trim_end(), after)
        }
        _ => {
            let mut s = old.trim_end().to_owned();
            if !s.is_empty() {
                s.push_str("\n\n");
            }
            s.push_str(section);
            s
        }
    };
    let new = if new.ends_with('\n') { new } else { new + "\n" };
    std::fs::write(DOCS, new).expect("docs/benchmarks.md is writable");
}

pub fn write_report(text: &str) {
    std::fs::write(REPORT, text).expect("docs/bench/load.md is writable");
}

pub fn command_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("{cmd}: unavailable"))
}

/// `git rev-parse --short HEAD`, or "unknown".
pub fn short_head() -> String {
    let rev = command_line(
        "git",
        &[
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "rev-parse",
            "--short",
            "HEAD",
        ],
    );
    if rev.starts_with("git:") {
        "unknown".to_owned()
    } else {
        rev
    }
}

pub fn git_revision() -> String {
    let dir = env!("CARGO_MANIFEST_DIR");
    let rev = command_line("git", &["-C", dir, "rev-parse", "--short", "HEAD"]);
    if rev.starts_with("git:") {
        return "an unknown revision (no git)".to_owned();
    }
    let dirty = Command::new("git")
        .args(["-C", dir, "status", "--porcelain", "--", "src", "lua"])
        .output()
        .is_ok_and(|o| !o.stdout.is_empty());
    if dirty {
        format!("commit `{rev}` plus uncommitted changes to src/ or lua/")
    } else {
        format!("commit `{rev}`")
    }
}

/// HEAD and the state of src/ and lua/ against it, to notice sources that
/// change during the run (the bench binary was built before it).
pub fn source_fingerprint() -> String {
    let dir = env!("CARGO_MANIFEST_DIR");
    [
        &["rev-parse", "HEAD"][..],
        &["diff", "HEAD", "--", "src", "lua"],
        &["status", "--porcelain", "--", "src", "lua"],
    ]
    .iter()
    .map(|args| {
        Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(*args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    })
    .collect()
}

pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// This process's nice value (field 19 of /proc/self/stat).
pub fn niceness() -> String {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // The command name (field 2) may hold spaces: count after ')'.
            let rest = &s[s.rfind(')')? + 1..];
            rest.split_whitespace().nth(16).map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// `YYYY-MM-DD HH:MM`, UTC, without a date crate (Howard Hinnant's
/// days-to-civil).
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let (hh, mm) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {hh:02}:{mm:02}")
}
