//! The in-process overhead (goal 3's second half): the three routers of
//! `benches/hot_path.rs` (shared through `benches/common/hot_routers.rs`),
//! timed in turns on one current-thread runtime: fleetlimit's layer over
//! bare axum, against the governor middleware over bare axum.

use std::time::Duration;

use http::HeaderValue;

use crate::hot_routers::{drive, keys, routers};

/// Requests per timed batch.
const BATCH: u64 = 30_000;
/// Alternated rounds: each times the three routers once, in a rotating order.
const ROUNDS: usize = 15;

pub struct InProcess {
    /// Median ns per request: fleetlimit, bare, governor middleware.
    pub fleet_ns: f64,
    pub bare_ns: f64,
    pub governor_ns: f64,
    /// Median over the rounds of (fleetlimit − bare) ÷ (governor − bare).
    pub ratio: Option<f64>,
    pub rounds: usize,
    pub batch: u64,
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

pub fn in_process() -> InProcess {
    println!("\nin-process overhead ({ROUNDS} rounds of {BATCH} requests per router)");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let keys: Vec<HeaderValue> = keys()
        .iter()
        .map(|k| HeaderValue::from_str(k).expect("a valid header value"))
        .collect();
    let (limited, bare, governed) = routers(&rt);
    let apps = [&limited, &bare, &governed];
    let mut next = [0usize; 3];
    // Warm-up: every bucket exists, caches are hot.
    for (i, app) in apps.iter().enumerate() {
        drive(&rt, app, &keys, &mut next[i], keys.len() as u64);
    }
    let mut per = [Vec::new(), Vec::new(), Vec::new()];
    let mut ratios = Vec::new();
    for round in 0..ROUNDS {
        let mut ns = [0.0; 3];
        for k in 0..3 {
            let i = (round + k) % 3;
            let t: Duration = drive(&rt, apps[i], &keys, &mut next[i], BATCH);
            ns[i] = t.as_nanos() as f64 / BATCH as f64;
        }
        for i in 0..3 {
            per[i].push(ns[i]);
        }
        let (f, b, g) = (ns[0], ns[1], ns[2]);
        if g > b {
            ratios.push((f - b) / (g - b));
        }
        println!(
            "  round {} fleetlimit {f:.0} ns  bare {b:.0} ns  governor middleware {g:.0} ns  \
             (fleetlimit − bare) ÷ (governor − bare) {:.2}",
            round + 1,
            (f - b) / (g - b)
        );
    }
    let [f, b, g] = per.map(median);
    InProcess {
        fleet_ns: f,
        bare_ns: b,
        governor_ns: g,
        ratio: (!ratios.is_empty()).then(|| median(ratios)),
        rounds: ROUNDS,
        batch: BATCH,
    }
}

pub fn in_process_text(p: &InProcess) -> String {
    format!(
        "The three routers of `benches/hot_path.rs` (axum bare, behind fleetlimit's \
         in-process layer, behind a minimal governor middleware; every request admitted, \
         10,000 keys), driven with `oneshot` on one current-thread runtime, {} rounds of \
         {} requests per router in a rotating order; medians.\n\n\
         | fleetlimit (memory) ns/req | bare axum ns/req | governor middleware ns/req | \
         (fleetlimit − bare) ÷ (governor − bare), median of the rounds |\n\
         |--:|--:|--:|--:|\n| {:.0} | {:.0} | {:.0} | {} |\n",
        p.rounds,
        p.batch,
        p.fleet_ns,
        p.bare_ns,
        p.governor_ns,
        crate::figures::opt(p.ratio, 2)
    )
}
