//! Issue 15's goals: this run's figures, the file that keeps the last runs'
//! (`docs/bench/runs.tsv`), and the table of the last three runs side by
//! side.

use std::fmt::Write as _;

use crate::c1::{Rtt, added};
use crate::contenders::{BARE, Contender, FLEET_MEMORY, FLEET_REDIS, GOVERNOR, PEER};
use crate::fleet::FleetResult;
use crate::inprocess::InProcess;
use crate::openloop::OpenRun;
use crate::scenarios::Measured;
use crate::scripts::ScriptRow;

pub const RUNS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/bench/runs.tsv");
/// Runs kept in `RUNS`.
const KEEP: usize = 10;

#[derive(Clone, Copy, Debug)]
pub enum Target {
    AtMost(f64),
    AtLeast(f64),
    Below(f64),
}

impl Target {
    pub fn holds(self, v: f64) -> bool {
        match self {
            Target::AtMost(t) => v <= t,
            Target::AtLeast(t) => v >= t,
            Target::Below(t) => v < t,
        }
    }

    fn text(self) -> String {
        match self {
            Target::AtMost(t) => format!("≤ {t}"),
            Target::AtLeast(t) => format!("≥ {t}"),
            Target::Below(t) => format!("< {t}"),
        }
    }
}

pub struct Figure {
    /// Stable name in `RUNS`.
    pub key: &'static str,
    pub goal: u8,
    pub what: &'static str,
    pub target: Target,
    pub value: Option<f64>,
}

/// Everything of this run the goals are read from.
pub struct Inputs<'a> {
    pub normal: Option<&'a [Measured]>,
    pub abuse: Option<&'a [Measured]>,
    pub c1: Option<&'a [Measured]>,
    pub rtt: Option<&'a Rtt>,
    pub open: &'a [OpenRun],
    pub fleet: Option<&'a FleetResult>,
    pub in_process: Option<&'a InProcess>,
    pub scripts: Option<&'a [ScriptRow]>,
}

fn find(rows: Option<&[Measured]>, c: Contender) -> Option<&Measured> {
    rows?.iter().find(|m| m.contender == c)
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    a.zip(b.filter(|b| *b > 0.0)).map(|(a, b)| a / b)
}

/// Limits one call of a script row decides (as `scripts::limits_decided`).
pub fn limits_decided(r: &ScriptRow) -> f64 {
    r.batch as f64
}

/// `a` per limit decided ÷ `b` per limit decided, the median over the
/// rounds in which both were measured: two scripts are compared in the same
/// round (minutes apart at most), so a quiet or busy moment of the machine
/// weighs on both.
pub fn paired(a: &ScriptRow, b: &ScriptRow) -> Option<f64> {
    let mut ratios: Vec<f64> = a
        .rounds
        .iter()
        .zip(&b.rounds)
        .map(|(x, y)| (x / limits_decided(a)) / (y / limits_decided(b)))
        .filter(|r| r.is_finite())
        .collect();
    ratios.sort_by(f64::total_cmp);
    let n = ratios.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(ratios[n / 2]),
        _ => Some((ratios[n / 2 - 1] + ratios[n / 2]) / 2.0),
    }
}

/// fleetlimit's costliest script per limit decided ÷ the reference token
/// bucket (paired by round), and its name.
pub fn worst_script(rows: &[ScriptRow]) -> Option<(f64, &'static str)> {
    let reference = rows.iter().find(|r| r.name.starts_with("reference"))?;
    rows.iter()
        .filter(|r| r.name.starts_with("fleetlimit"))
        .filter_map(|r| Some((paired(r, reference)?, r.name)))
        .max_by(|a, b| a.0.total_cmp(&b.0))
}

pub fn figures(i: &Inputs) -> Vec<Figure> {
    let server = |rows, c| find(rows, c).and_then(|m| m.cpu.server_us_per_req);
    let redis_cpu = |rows, c| find(rows, c).and_then(|m| m.cpu.redis_us_per_req);
    let rps = |rows, c| find(rows, c).map(|m| m.stats.rps);
    let script = |pick: &dyn Fn(&ScriptRow) -> bool| i.scripts?.iter().find(|r| pick(r));
    let lean16_vs_incr = script(&|r| r.name.contains("lean") && r.batch == 16)
        .zip(script(&|r| r.name.starts_with("INCR")))
        .and_then(|(lean16, incr)| paired(lean16, incr));
    let c1_added = i.c1.map(added).and_then(|a| a.fleet_us);
    let open_p99 = |pct: u32, c: Contender| {
        i.open
            .iter()
            .find(|r| {
                r.percent == pct && r.label.contains(PEER.name()) && r.measured.contender == c
            })
            .map(|r| f64::from(r.measured.stats.p99_us))
    };
    let (n, a) = (i.normal, i.abuse);
    vec![
        Figure {
            key: "g1_server_cpu_vs_peer",
            goal: 1,
            what: "(a) fleetlimit (Redis) server CPU/req ÷ tower-rate-limit-fred's",
            target: Target::AtMost(0.8),
            value: ratio(server(n, FLEET_REDIS), server(n, PEER)),
        },
        Figure {
            key: "g1_redis_cpu_vs_peer",
            goal: 1,
            what: "(a) fleetlimit (Redis) Redis CPU/req ÷ tower-rate-limit-fred's",
            target: Target::AtMost(0.5),
            value: ratio(redis_cpu(n, FLEET_REDIS), redis_cpu(n, PEER)),
        },
        Figure {
            key: "g1_rps_vs_peer",
            goal: 1,
            what: "(a) fleetlimit (Redis) req/s ÷ tower-rate-limit-fred's",
            target: Target::AtLeast(1.3),
            value: ratio(rps(n, FLEET_REDIS), rps(n, PEER)),
        },
        Figure {
            key: "g2_redis_server_cpu_vs_bare",
            goal: 2,
            what: "(b) fleetlimit (Redis) server CPU/req ÷ bare axum's",
            target: Target::AtMost(1.15),
            value: ratio(server(a, FLEET_REDIS), server(a, BARE)),
        },
        Figure {
            key: "g2_memory_server_cpu_vs_bare",
            goal: 2,
            what: "(b) fleetlimit (memory) server CPU/req ÷ bare axum's",
            target: Target::AtMost(1.15),
            value: ratio(server(a, FLEET_MEMORY), server(a, BARE)),
        },
        Figure {
            key: "g3_memory_server_cpu_vs_governor",
            goal: 3,
            what: "(a) fleetlimit (memory) server CPU/req ÷ tower_governor's",
            target: Target::AtMost(1.0),
            value: ratio(server(n, FLEET_MEMORY), server(n, GOVERNOR)),
        },
        Figure {
            key: "g3_in_process_overhead_vs_governor",
            goal: 3,
            what: "in process: (fleetlimit − bare) ÷ (governor middleware − bare)",
            target: Target::AtMost(1.2),
            value: i.in_process.and_then(|p| p.ratio),
        },
        Figure {
            key: "g4_lean16_decision_vs_incr_expire",
            goal: 4,
            what: "lean script at 16 checks/call, Redis µs per decision ÷ INCR + EXPIRE per call",
            target: Target::AtMost(1.0),
            value: lean16_vs_incr,
        },
        Figure {
            key: "g4_worst_script_vs_reference",
            goal: 4,
            what: "costliest fleetlimit script, Redis µs per limit decided ÷ reference bucket",
            target: Target::AtMost(0.6),
            value: i.scripts.and_then(worst_script).map(|w| w.0),
        },
        Figure {
            key: "g5_c1_added_vs_rtt",
            goal: 5,
            what: "(f) one connection: (fleetlimit p50 − bare p50) ÷ Redis round trip p50",
            target: Target::AtMost(1.1),
            value: ratio(c1_added, i.rtt.map(|r| r.p50_us)),
        },
        Figure {
            key: "g6_p99_vs_peer_at_50",
            goal: 6,
            what: "(g) open loop at 50 % of the peer's peak: fleetlimit p99 ÷ peer p99",
            target: Target::AtMost(1.0),
            value: ratio(open_p99(50, FLEET_REDIS), open_p99(50, PEER)),
        },
        Figure {
            key: "g6_p99_vs_peer_at_80",
            goal: 6,
            what: "(g) open loop at 80 % of the peer's peak: fleetlimit p99 ÷ peer p99",
            target: Target::AtMost(1.0),
            value: ratio(open_p99(80, FLEET_REDIS), open_p99(80, PEER)),
        },
        Figure {
            key: "g7_redis_core_share_at_seed_load",
            goal: 7,
            what: "(h) fleet: share of one Redis core 200,000 checks/s would take",
            target: Target::AtMost(0.6),
            value: i.fleet.and_then(FleetResult::seed_core_share),
        },
        Figure {
            key: "g7_p99_added_ms_at_80",
            goal: 7,
            what: "(h) fleet at 80 % load: p99 − bare axum's p99, ms",
            target: Target::Below(2.0),
            value: i
                .fleet
                .and_then(FleetResult::p99_added_us)
                .map(|us| us / 1000.0),
        },
    ]
}

/// One past run in `RUNS`.
pub struct PastRun {
    pub date: String,
    pub commit: String,
    pub values: Vec<(String, f64)>,
}

impl PastRun {
    fn get(&self, key: &str) -> Option<f64> {
        self.values.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }
}

/// The runs in `RUNS`, oldest first.
pub fn read_runs() -> Vec<PastRun> {
    let text = std::fs::read_to_string(RUNS).unwrap_or_default();
    let mut runs: Vec<PastRun> = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let f: Vec<&str> = line.split('\t').collect();
        let [date, commit, key, value] = f[..] else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        match runs.last_mut() {
            Some(r) if r.date == date && r.commit == commit => {
                r.values.push((key.to_owned(), value));
            }
            _ => runs.push(PastRun {
                date: date.to_owned(),
                commit: commit.to_owned(),
                values: vec![(key.to_owned(), value)],
            }),
        }
    }
    runs
}

/// Appends this run to `RUNS` (keeping the last `KEEP`) and returns the
/// runs, oldest first, this one last.
pub fn record_run(date: &str, commit: &str, figures: &[Figure]) -> Vec<PastRun> {
    let mut runs = read_runs();
    runs.push(PastRun {
        date: date.to_owned(),
        commit: commit.to_owned(),
        values: figures
            .iter()
            .filter_map(|f| Some((f.key.to_owned(), f.value.filter(|v| v.is_finite())?)))
            .collect(),
    });
    let drop = runs.len().saturating_sub(KEEP);
    runs.drain(..drop);
    let mut out = String::from(
        "# Issue 15's goal figures of the last full runs of `cargo bench --bench load`\n\
         # (written by benches/load/goals.rs): date (UTC), commit, figure, value\n",
    );
    for r in &runs {
        for (k, v) in &r.values {
            let _ = writeln!(out, "{}\t{}\t{k}\t{v:.4}", r.date, r.commit);
        }
    }
    if let Some(dir) = std::path::Path::new(RUNS).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(e) = std::fs::write(RUNS, out) {
        println!("load harness: {RUNS} not written: {e}");
    }
    runs
}

/// The goals with the last three runs side by side (oldest first).
pub fn goals_table(figures: &[Figure], runs: &[PastRun]) -> String {
    let last: Vec<&PastRun> = runs.iter().rev().take(3).rev().collect();
    let mut t = String::from("| goal | figure | target |");
    for (k, r) in last.iter().enumerate() {
        let this = if k + 1 == last.len() {
            "this run, "
        } else {
            ""
        };
        let _ = write!(t, " {this}{} `{}` |", r.date, r.commit);
    }
    t.push_str(" holds in all three |\n|--:|---|--:|");
    t.push_str(&"--:|".repeat(last.len()));
    t.push_str("---|\n");
    for f in figures {
        let mut cells = Vec::new();
        let mut all = true;
        for r in &last {
            match r.get(f.key) {
                Some(v) => {
                    let ok = f.target.holds(v);
                    all &= ok;
                    cells.push(format!("{v:.2} {}", if ok { "✓" } else { "✗" }));
                }
                None => {
                    all = false;
                    cells.push("—".to_owned());
                }
            }
        }
        let holds = if !all {
            "no"
        } else if last.len() < 3 {
            "not yet: fewer than three runs"
        } else {
            "yes"
        };
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {holds} |",
            f.goal,
            f.what,
            f.target.text(),
            cells.join(" | ")
        );
    }
    t
}
