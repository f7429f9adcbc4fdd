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
