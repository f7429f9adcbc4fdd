//! The accuracy account (docs/accuracy.md): seeded request timelines
//! replayed through the layer and through an exact reference (the same
//! algorithm on one clock in one process, `reference.rs`); per scenario,
//! the requests offered, the share wrongly admitted and wrongly refused,
//! next to the bound the configuration promises.
//!
//! Run with `cargo bench --bench accuracy`. It prints the table, writes it
//! into docs/accuracy.md (between its markers) and draws
//! docs/bench/accuracy.svg.

#[path = "../../tests/support/mod.rs"]
mod support;

mod cluster;
mod fleet;
mod inprocess;
mod redis;
mod reference;
mod report;
mod score;

use std::path::Path;

/// splitmix64: a seeded timeline, the same on every run.
pub struct Rng(u64);

impl Rng {
    pub fn u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn f64(&mut self) -> f64 {
        (self.u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An exponential gap of mean `mean`.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.f64()).ln()
    }
}

fn main() {
    // `cargo bench` hands harness-less benches `--bench`; nothing to parse.
    let mut rng = Rng(24);
    let mut rows = Vec::new();
    rows.extend(inprocess::steady(&mut rng));
    rows.extend(inprocess::edges(&mut rng));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        rows.extend(redis::steady(&mut rng, 0.5).await);
        rows.extend(redis::steady(&mut rng, 1.5).await);
        rows.extend(redis::freeze(&mut rng, "open").await);
        rows.extend(redis::freeze(&mut rng, "local").await);
        rows.extend(redis::cut(&mut rng).await);
        rows.extend(redis::refused(&mut rng).await);
        rows.extend(redis::coalesced().await);
        rows.extend(redis::leases(&mut rng, 2000.0, 1.1).await);
        rows.extend(redis::leases(&mut rng, 750.0, 3.0).await);
        rows.extend(cluster::cross_slot(&mut rng).await);
    });

    let table = report::markdown(&rows);
    println!("{table}");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc_path = root.join("docs/accuracy.md");
    let doc = std::fs::read_to_string(&doc_path).expect("docs/accuracy.md");
    std::fs::write(&doc_path, report::splice(&doc, &table)).expect("docs/accuracy.md written");
    std::fs::write(root.join("docs/bench/accuracy.svg"), report::svg(&rows))
        .expect("docs/bench/accuracy.svg written");
    let outside: Vec<&str> = rows
        .iter()
        .filter(|r| !r.within())
        .map(|r| r.scenario.as_str())
        .collect();
    if !outside.is_empty() {
        println!("outside their bound: {}", outside.join(", "));
    }
}
