//! The account: a table on stdout and in docs/accuracy.md, and a bar chart
//! (docs/bench/accuracy.svg, hand-written SVG: no font or plotting crate).

use std::fmt::Write as _;

use crate::score::Tally;

/// One scenario's line of the account.
#[derive(Clone, Debug)]
pub struct Row {
    pub scenario: String,
    pub tally: Tally,
    /// What the configuration promises, in requests.
    pub bound_admitted: u64,
    pub bound_refused: u64,
    /// How the bound follows from the configuration.
    pub bound_why: String,
    /// What else the run saw (script calls, policy answers...).
    pub note: String,
    /// The refusals' bound holds net of the admissions that repay them
    /// (the echo column): leases move a key's admissions between
    /// instances in time, and only what is never repaid is lost.
    pub net: bool,
}

impl Row {
    pub fn within(&self) -> bool {
        self.tally.wrong_admitted <= self.bound_admitted && self.refused() <= self.bound_refused
    }

    /// The wrong refusals its bound is about.
    fn refused(&self) -> u64 {
        if self.net {
            self.tally.wrong_refused.saturating_sub(self.tally.echo)
        } else {
            self.tally.wrong_refused
        }
    }
}

fn pct(n: u64, of: u64) -> String {
    if of == 0 {
        return "–".into();
    }
    let p = 100.0 * n as f64 / of as f64;
    if n == 0 {
        "0".into()
    } else if p < 0.01 {
        format!("{p:.4} %")
    } else {
        format!("{p:.2} %")
    }
}

pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "| scenario | offered | admitted: layer / exact | wrongly admitted | wrongly refused | timing | echo | bound: admitted / refused | within |\n\
         |---|---:|---:|---:|---:|---:|---:|---|:-:|\n",
    );
    for r in rows {
        let t = &r.tally;
        let _ = writeln!(
            s,
            "| {} | {} | {} / {} | {} ({}) | {} ({}) | {} | {} | {} / {}: {} | {} |",
            r.scenario,
            t.offered,
            t.admitted,
            t.exact_admitted,
            t.wrong_admitted,
            pct(t.wrong_admitted, t.offered),
            t.wrong_refused,
            pct(t.wrong_refused, t.offered),
            t.jitter,
            t.echo,
            r.bound_admitted,
            if r.net {
                format!("{} net", r.bound_refused)
            } else {
                r.bound_refused.to_string()
            },
            r.bound_why,
            if r.within() { "yes" } else { "**no**" },
        );
    }
    let notes: Vec<&Row> = rows.iter().filter(|r| !r.note.is_empty()).collect();
    if !notes.is_empty() {
        s.push('\n');
        for r in notes {
            let _ = writeln!(s, "- {}: {}", r.scenario, r.note);
        }
    }
    s
}

/// Replaces what lies between the table's markers in `doc`.
pub fn splice(doc: &str, table: &str) -> String {
    const START: &str = "<!-- accuracy-table -->";
    const END: &str = "<!-- /accuracy-table -->";
    let Some(a) = doc.find(START) else {
        return doc.to_owned();
    };
    let body_start = a + START.len();
    let tail = match doc[body_start..].find(END) {
        Some(b) => &doc[body_start + b + END.len()..],
        None => &doc[body_start..],
    };
    format!(
        "{}\n\n{}\n{}{}",
        &doc[..body_start],
        table.trim_end(),
        END,
        tail
    )
}

/// Two bars per scenario (wrongly admitted, wrongly refused, as shares of
/// what was offered) and a tick at each bound, on one linear axis.
pub fn svg(rows: &[Row]) -> String {
    let share = |n: u64, of: u64| if of == 0 { 0.0 } else { n as f64 / of as f64 };
    let mut top: f64 = 0.01;
    for r in rows {
        let o = r.tally.offered;
        top = top
            .max(share(r.tally.wrong_admitted, o))
            .max(share(r.refused(), o))
            .max(share(r.bound_admitted, o))
            .max(share(r.bound_refused, o));
    }
    let top = top.min(1.0);
    let (label_w, plot_w, row_h) = (460.0, 400.0, 34.0);
    let h = 50.0 + row_h * rows.len() as f64 + 30.0;
    let w = label_w + plot_w + 30.0;
    let x = |f: f64| label_w + plot_w * (f / top).min(1.0);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"20\" font-size=\"14\">Wrong decisions, share of requests offered \
         (cargo bench --bench accuracy)</text>\n\
         <rect x=\"{label_w}\" y=\"28\" width=\"10\" height=\"10\" fill=\"#d62728\"/>\
         <text x=\"{}\" y=\"37\">wrongly admitted</text>\n\
         <rect x=\"{}\" y=\"28\" width=\"10\" height=\"10\" fill=\"#1f77b4\"/>\
         <text x=\"{}\" y=\"37\">wrongly refused (leases: net)</text>\n\
         <line x1=\"{}\" y1=\"28\" x2=\"{}\" y2=\"38\" stroke=\"black\" stroke-width=\"2\"/>\
         <text x=\"{}\" y=\"37\">bound</text>\n",
        label_w + 14.0,
        label_w + 130.0,
        label_w + 144.0,
        label_w + 330.0,
        label_w + 330.0,
        label_w + 336.0,
    );
    for (i, r) in rows.iter().enumerate() {
        let y = 50.0 + row_h * i as f64;
        let o = r.tally.offered;
        let _ = writeln!(
            s,
            "<text x=\"10\" y=\"{}\">{}</text>",
            y + 20.0,
            escape(&r.scenario)
        );
        for (j, (n, bound, colour)) in [
            (r.tally.wrong_admitted, r.bound_admitted, "#d62728"),
            (r.refused(), r.bound_refused, "#1f77b4"),
        ]
        .into_iter()
        .enumerate()
        {
            let yb = y + 4.0 + 13.0 * j as f64;
            let _ = writeln!(
                s,
                "<rect x=\"{label_w}\" y=\"{yb}\" width=\"{:.1}\" height=\"11\" fill=\"{colour}\"/>\
                 <line x1=\"{:.1}\" y1=\"{yb}\" x2=\"{:.1}\" y2=\"{}\" stroke=\"black\" stroke-width=\"2\"/>\
                 <text x=\"{:.1}\" y=\"{}\" font-size=\"10\">{}</text>",
                (x(share(n, o)) - label_w).max(0.5),
                x(share(bound, o)),
                x(share(bound, o)),
                yb + 11.0,
                x(share(n, o)) + 4.0,
                yb + 10.0,
                pct(n, o),
            );
        }
    }
    let ya = 50.0 + row_h * rows.len() as f64;
    let _ = writeln!(
        s,
        "<line x1=\"{label_w}\" y1=\"{ya}\" x2=\"{}\" y2=\"{ya}\" stroke=\"#888\"/>\
         <text x=\"{label_w}\" y=\"{}\">0</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.1} %</text>\n</svg>",
        label_w + plot_w,
        ya + 15.0,
        label_w + plot_w,
        ya + 15.0,
        100.0 * top,
    );
    s
}

fn escape(s: &str) -> String {
    s.replace('`', "")
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
