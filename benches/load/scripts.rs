//! What each rate-limit script costs Redis, measured with
//! `redis-benchmark`. The only place that names files of `lua/`.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use fleetlimit::store::RedisStore;

use crate::redis::{RedisServer, Reply, cmdstat};

/// A script measured with `redis-benchmark`: `EVALSHA <sha> 1 <key> <args..>`,
/// `__rand_int__` in the key spreading the calls over 10,000 keys.
#[derive(Clone, Copy)]
pub struct ScriptCase {
    pub name: &'static str,
    pub text: Text,
    pub key: &'static str,
    /// Arguments sent once, after the keys (the "not after" bound, and the
    /// decision script's cost and slot id).
    pub head: &'static [&'static str],
    /// Arguments of each decision (each limit of the decision script).
    pub args: &'static [&'static str],
    /// The SHA the library sends, when the script is the library's.
    pub library_sha: Option<fn() -> String>,
    /// Decisions (limits decided) per call: the key and its arguments are
    /// repeated this many times (`EVALSHA <sha> <n> <key>×n <head> <args>×n`),
    /// for the coalesced script and a route of several limits.
    pub batch: usize,
}

/// Where a script's text comes from.
#[derive(Clone, Copy)]
pub enum Text {
    /// Compiled in.
    Inline(&'static str),
    /// Files of this crate, concatenated, read at run time: a script that
    /// is not there (yet, or any more) is skipped with a note instead of
    /// breaking the build.
    File(&'static [&'static str]),
}

impl Text {
    pub fn load(self) -> Result<String, String> {
        match self {
            Text::Inline(t) => Ok(t.to_owned()),
            Text::File(paths) => paths
                .iter()
                .map(|path| {
                    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path);
                    std::fs::read_to_string(&full).map_err(|e| format!("{path}: {e}"))
                })
                .collect(),
        }
    }
}

/// The design documents' reference token bucket (a hash, `HMGET`/`HSET`/
/// `EXPIRE`): what the other scripts are compared with.
pub const REFERENCE_BUCKET: &str = r"local capacity = tonumber(ARGV[1])
local rate     = tonumber(ARGV[2])
local cost     = tonumber(ARGV[3])
local t   = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1]) or capacity
local ts     = tonumber(b[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - ts) * rate)
local allowed = 0
local wait = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
else
  wait = (cost - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('EXPIRE', KEYS[1], math.ceil(capacity / rate) + 1)
return { allowed, tostring(tokens), tostring(wait) }
";

/// A fixed-window counter as a script: the cheapest useful script.
pub const INCR_EXPIRE: &str =
    "local n = redis.call('INCR', KEYS[1]) redis.call('EXPIRE', KEYS[1], 60) return n";

/// The peer's GCRA, as published in tower-rate-limit-fred 2.1.1
/// (`scripts/rate_limit.lua`, MIT-licensed script, modified there from
/// rwz/redis-gcra), re-typed here. ARGV: capacity, emission interval in ms.
pub const PEER_GCRA: &str = r#"redis.replicate_commands()

local key = KEYS[1]
local capacity = ARGV[1]
local emission_interval = ARGV[2] * 1000 -- ms to us
local window = capacity * emission_interval

local now = redis.call("TIME")
local sep_1_2025 = 1756684800 -- relative epoch to reduce int size; works for ~31.7 years
now = (now[1] - sep_1_2025) * 1000 * 1000 + now[2]
local tat = tonumber(redis.call("GET", key)) or now
local new_tat = math.max(tat, now) + emission_interval
local diff = now + window - new_tat

if diff < 0 then
  return {0, math.ceil(-diff / 1000 / 1000)}
end

redis.call("SET", key, new_tat, "PX", math.ceil((new_tat - now) / 1000))
return {1, 0}
"#;

/// A file of `lua/`, compiled in.
macro_rules! lua {
    ($file:literal) => {
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $file))
    };
}

/// fleetlimit's decision script, composed as `src/algorithm/mod.rs` does.
pub const FLEETLIMIT_DECIDE: &str = concat!(
    lua!("token_bucket.lua"),
    lua!("decide.lua"),
    lua!("token_bucket_general.lua"),
    lua!("fixed_window.lua"),
    lua!("sliding_window.lua"),
    lua!("concurrency.lua"),
    lua!("decide_end.lua"),
);

/// fleetlimit's lean script, composed as `src/algorithm/token_bucket.rs`
/// does.
const FLEETLIMIT_LEAN: &[&str] = &["lua/token_bucket.lua", "lua/token_bucket_lean.lua"];

/// fleetlimit's scripts, each with the arguments of one token-bucket limit
/// (burst 1000, 1000/s, cost 1). Add a leaner script here and it is
/// measured and reported with the others.
pub const FLEETLIMIT_SCRIPTS: &[ScriptCase] = &[
    // The layer never sends this script for a lone token bucket (shadow or
    // not, a refund included): that goes to the lean script. The cases are
    // the shapes it is sent for.
    ScriptCase {
        name: "fleetlimit decision script, one fixed window",
        text: Text::Inline(FLEETLIMIT_DECIDE),
        key: "rl:per-key:{key-__rand_int__}",
        // not after ("": no bound), cost, slot id (unused), then per limit:
        // algorithm, limit, window ms, shadow
        head: &["", "1", "-"],
        args: &["f", "1000", "1000", "0"],
        library_sha: Some(RedisStore::script_sha),
        batch: 1,
    },
    ScriptCase {
        name: "fleetlimit decision script, one sliding window",
        text: Text::Inline(FLEETLIMIT_DECIDE),
        key: "rl:per-key:{key-__rand_int__}",
        head: &["", "1", "-"],
        args: &["s", "1000", "1000", "0"],
        library_sha: Some(RedisStore::script_sha),
        batch: 1,
    },
    ScriptCase {
        name: "fleetlimit decision script, four token buckets (login ladder)",
        text: Text::Inline(FLEETLIMIT_DECIDE),
        // Four keys: redis-benchmark draws each `__rand_int__` on its own.
        key: "rl:per-key:{key-__rand_int__}",
        // not after ("": no bound), cost, slot id (unused), then per
        // limit: algorithm, capacity, refill/s, shadow
        head: &["", "1", "-"],
        args: &["t", "1000", "1000", "0"],
        library_sha: Some(RedisStore::script_sha),
        batch: 4,
    },
    ScriptCase {
        name: "fleetlimit decision script (lua/*.lua concatenated, one concurrency limit)",
        text: Text::Inline(FLEETLIMIT_DECIDE),
        key: "rl:in-flight:{key-__rand_int__}",
        // not after ("": no bound), cost, slot id, then: algorithm,
        // max_in_flight, max_hold ms, shadow
        // (a slot is never released here: each key fills to 1000 at most)
        head: &["", "1", "s-__rand_int__"],
        args: &["c", "1000", "60000", "0"],
        library_sha: Some(RedisStore::script_sha),
        batch: 1,
    },
    ScriptCase {
        name: "fleetlimit lean script, 1 decision per call (lua/token_bucket_lean.lua)",
        text: Text::File(FLEETLIMIT_LEAN),
        key: "rl:per-key:{key-__rand_int__}",
        // not after ("": no bound), then per decision: cost × µs per
        // token, capacity × µs per token
        head: &[""],
        args: &["1000", "1000000"],
        library_sha: Some(RedisStore::lean_script_sha),
        batch: 1,
    },
    ScriptCase {
        name: "fleetlimit lean script, 4 decisions per call (coalesced)",
        text: Text::File(FLEETLIMIT_LEAN),
        key: "rl:per-key:{key-__rand_int__}",
        head: &[""],
        args: &["1000", "1000000"],
        library_sha: Some(RedisStore::lean_script_sha),
        batch: 4,
    },
    ScriptCase {
        name: "fleetlimit lean script, 16 decisions per call (coalesced)",
        text: Text::File(FLEETLIMIT_LEAN),
        key: "rl:per-key:{key-__rand_int__}",
        head: &[""],
        args: &["1000", "1000000"],
        library_sha: Some(RedisStore::lean_script_sha),
        batch: 16,
    },
];

pub fn script_cases() -> Vec<ScriptCase> {
    let mut cases = vec![
        ScriptCase {
            name: "reference token bucket (design documents)",
            text: Text::Inline(REFERENCE_BUCKET),
            key: "ref:{key-__rand_int__}",
            head: &[],
            args: &["1000", "1000", "1"],
            library_sha: None,
            batch: 1,
        },
        ScriptCase {
            name: "INCR + EXPIRE",
            text: Text::Inline(INCR_EXPIRE),
            key: "incr:{key-__rand_int__}",
            head: &[],
            args: &[],
            library_sha: None,
            batch: 1,
        },
    ];
    cases.extend_from_slice(FLEETLIMIT_SCRIPTS);
    cases.push(ScriptCase {
        name: "tower-rate-limit-fred 2.1.1 GCRA",
        text: Text::Inline(PEER_GCRA),
        key: "peer:{key-__rand_int__}",
        head: &[],
        args: &["1000", "1"],
        library_sha: None,
        batch: 1,
    });
    cases
}

/// Limits one call decides.
pub fn limits_decided(case: &ScriptCase) -> usize {
    case.batch
}

/// Rounds of the script costs, in alternating order.
const ROUNDS: usize = 3;

pub struct ScriptRow {
    pub name: &'static str,
    pub batch: usize,
    /// The lowest of the rounds.
    pub us_per_call: f64,
    /// Each round's figure, in round order (NaN: not measured): goals
    /// compare scripts measured in the same round.
    pub rounds: Vec<f64>,
    pub bench_rps: Option<f64>,
    pub note: String,
}

/// µs of Redis CPU per call of each script (`usec` ÷ `calls` of
/// `cmdstat_evalsha`), each measured twice in alternating order, the
/// lower kept. `None` when `redis-benchmark` is missing.
pub fn script_costs(redis: &RedisServer) -> Option<Vec<ScriptRow>> {
    // Decisions per case, not calls: a call of 16 checks takes 16 times as
    // long, and the whole run must stay under 6 minutes.
    const DECISIONS: usize = 100_000;
    const MIN_CALLS: usize = 10_000;
    if Command::new("redis-benchmark")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_err()
    {
        println!(
            "\nload harness: redis-benchmark not found (Debian package redis-tools); \
             skipping the script costs"
        );
        return None;
    }
    println!(
        "\nRedis CPU per script call (redis-benchmark -P 16 -n {DECISIONS} ÷ limits per call, \
         at least {MIN_CALLS}, -r 10000)"
    );
    let cases = script_cases();
    let mut rows: Vec<Option<ScriptRow>> = (0..cases.len()).map(|_| None).collect();
    let mut skipped: Vec<Option<String>> = vec![None; cases.len()];
    let mut per_round: Vec<Vec<f64>> = vec![Vec::with_capacity(ROUNDS); cases.len()];
    for round in 0..ROUNDS {
        let mut order: Vec<usize> = (0..cases.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let case = &cases[i];
            let text = match case.text.load() {
                Ok(t) => t,
                Err(e) => {
                    println!("  round {} {:<58} skipped: {e}", round + 1, case.name);
                    skipped[i] = Some(e);
                    per_round[i].push(f64::NAN);
                    continue;
                }
            };
            redis.flushall();
            let sha = match redis.must(&["SCRIPT", "LOAD", &text]) {
                Reply::Bulk(b) => String::from_utf8(b).expect("a hex SHA"),
                r => panic!("SCRIPT LOAD answered {r:?}"),
            };
            let mut note = String::new();
            if let Some(library) = case.library_sha {
                if library() != sha {
                    note = format!(
                        "the library's script_sha() is {}, not the SHA of lua/*.lua as \
                         concatenated here ({sha}): measured the latter",
                        library()
                    );
                }
            }
            redis.reset_stats();
            let calls = (DECISIONS / limits_decided(case))
                .max(MIN_CALLS)
                .to_string();
            let out = Command::new("redis-benchmark")
                .args(["-h", "127.0.0.1", "-p", &redis.port().to_string()])
                .args(["-P", "16", "-n", &calls, "-r", "10000", "--csv"])
                .args(["EVALSHA", &sha, &case.batch.to_string()])
                .args(std::iter::repeat_n(case.key, case.batch))
                .args(case.head)
                .args(std::iter::repeat_n(case.args, case.batch).flatten())
                .stderr(Stdio::null())
                .output()
                .expect("redis-benchmark runs");
            let stats = cmdstat(&redis.commandstats(), "evalsha");
            let bench_rps = String::from_utf8_lossy(&out.stdout)
                .lines()
                .nth(1)
                .and_then(|l| l.split(',').nth(1))
                .and_then(|v| v.trim_matches('"').parse::<f64>().ok());
            let Some(stats) = stats.filter(|s| s.calls > 0) else {
                panic!("{}: no EVALSHA calls counted", case.name);
            };
            if stats.failed > 0 {
                let _ = write!(note, "{} of {} calls failed", stats.failed, stats.calls);
            }
            let us_per_call = stats.usec as f64 / stats.calls as f64;
            per_round[i].push(us_per_call);
            println!(
                "  round {} {:<58} {:>6.2} µs/call  ({} calls{})",
                round + 1,
                case.name,
                us_per_call,
                stats.calls,
                if note.is_empty() {
                    String::new()
                } else {
                    format!("; {note}")
                }
            );
            if rows[i].as_ref().is_none_or(|r| us_per_call < r.us_per_call) {
                rows[i] = Some(ScriptRow {
                    name: case.name,
                    batch: case.batch,
                    us_per_call,
                    rounds: Vec::new(),
                    bench_rps,
                    note,
                });
            }
        }
    }
    Some(
        rows.into_iter()
            .zip(skipped)
            .zip(&cases)
            .zip(per_round)
            .map(|(((r, skip), case), rounds)| {
                let row = r.unwrap_or_else(|| ScriptRow {
                    name: case.name,
                    batch: case.batch,
                    us_per_call: f64::NAN,
                    rounds: Vec::new(),
                    bench_rps: None,
                    note: format!("not measured: {}", skip.unwrap_or_default()),
                });
                ScriptRow { rounds, ..row }
            })
            .collect(),
    )
}
