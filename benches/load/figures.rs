//! Numbers as the tables print them.

/// A figure with `prec` decimals, or "—".
pub fn opt(v: Option<f64>, prec: usize) -> String {
    v.filter(|v| v.is_finite())
        .map_or_else(|| "—".to_owned(), |v| format!("{v:.prec$}"))
}

pub fn thousands(n: f64) -> String {
    let s = format!("{:.0}", n.max(0.0));
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// The part of a progress line every timed run shares: latency
/// percentiles, failures, CPU per request (`servers`: the column's name for
/// the server side) and how busy each side was.
pub fn run_line(s: &crate::generator::Stats, cpu: &crate::cpu::CpuUse, servers: &str) -> String {
    format!(
        "p50 {:>5} p90 {:>5} p99 {:>6} p99.9 {:>6} µs  errors/other {}  CPU µs/req {servers} {} \
         Redis {}  busy {}",
        s.p50_us,
        s.p90_us,
        s.p99_us,
        s.p999_us,
        s.errors + s.other,
        opt(cpu.server_us_per_req, 1),
        opt(cpu.redis_us_per_req, 1),
        cpu.busy(),
    )
}
