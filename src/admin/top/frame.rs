//! A [`TopFrame`] as text: one screen, the way an operator reads it.

use std::fmt;

use super::{Fleet, LimitView, TopFrame};
use crate::admin::printable;
use crate::admin::time::format_time;
use crate::algorithm::INVALID_STATE;

fn num(x: f64) -> String {
    let s = format!("{x:.1}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

impl fmt::Display for TopFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "fleetlimit top: prefix \"{}\", {} (Redis time)",
            printable(&self.prefix),
            format_time(self.now_ms)
        )?;
        match &self.fleet {
            Fleet::Configured(n) => writeln!(
                f,
                "instances: fleet discovery off; fleet size {n} from the configuration"
            )?,
            Fleet::Live {
                key,
                dead_after,
                count,
                shown,
            } => {
                writeln!(
                    f,
                    "instances: {count} live ({}, dead after {} s silent)",
                    printable(key),
                    num(dead_after.as_secs_f64())
                )?;
                for i in shown {
                    writeln!(
                        f,
                        "  {}  last beat {} s ago",
                        printable(&i.id),
                        num(i.ms_ago as f64 / 1000.0)
                    )?;
                }
                if *count as usize > shown.len() {
                    writeln!(f, "  ... and {} more", *count as usize - shown.len())?;
                }
            }
        }
        for l in &self.limits {
            write!(f, "limit {} ({})", printable(&l.name), l.rule)?;
            if l.concurrency {
                writeln!(f, ": slots in flight are not sampled")?;
                continue;
            }
            write!(f, ": {} keys in view, {} exhausted", l.sampled, l.exhausted)?;
            if l.invalid > 0 {
                write!(f, ", {} with an {INVALID_STATE}", l.invalid)?;
            }
            writeln!(f)?;
            for k in &l.keys {
                let (id, left, capacity, on_plans) = (&k.id, &k.remaining, &k.capacity, k.on_plans);
                let most = on_plans.unwrap_or(*left);
                let mark = if most < 1.0 { "  EXHAUSTED" } else { "" };
                write!(
                    f,
                    "  {}  {}/{}{mark}",
                    printable(id),
                    left.floor(),
                    num(*capacity)
                )?;
                match on_plans {
                    Some(p) if p.floor() > left.floor() => {
                        writeln!(f, "  (up to {} on a plan)", p.floor())?
                    }
                    _ => writeln!(f)?,
                }
            }
        }
        let window = self.window.as_secs_f64();
        let recorded: Vec<&LimitView> = self
            .limits
            .iter()
            .filter(|l| l.recorded.is_some())
            .collect();
        if recorded.is_empty() {
            writeln!(
                f,
                "refusals: no limit records its decisions (record = true)"
            )?;
        } else {
            writeln!(f, "refusals recorded in the last {} s:", num(window))?;
            for l in recorded {
                let Some((refused, total, cut)) = l.recorded else {
                    continue;
                };
                let at_least = if cut { "at least " } else { "" };
                writeln!(
                    f,
                    "  {}  {at_least}{refused} refused of {total} decisions, {} refused/s",
                    printable(&l.name),
                    num(refused as f64 / window.max(0.001))
                )?;
            }
        }
        writeln!(
            f,
            "scan: {} keys this refresh{}",
            self.scanned,
            if self.pass_done {
                ", pass over the keyspace complete"
            } else {
                ""
            }
        )
    }
}
