//! `top`'s refresh loop, and the output helpers it shares with the other
//! commands.

use std::io::IsTerminal;
use std::time::Duration;

use super::write_out;
use crate::admin::{self, printable};
use crate::config::format_duration;

/// `top --sample`: keys per SCAN page and per pipelined read, at most.
pub(crate) const MAX_SAMPLE: usize = 10_000;
/// `top` gives up (exit 1) after this many failed frames in a row.
pub(crate) const FAILED_FRAMES: u32 = 60;

/// Frames until interrupted (or stdout closes). A failed frame is shown as
/// such and the next refresh tries again (Redis may be restarting), up to
/// [`FAILED_FRAMES`] in a row.
pub(crate) async fn top_loop(
    top: &mut admin::Top,
    interval: Duration,
    json: bool,
) -> Result<(), (u8, String)> {
    let clear = std::io::stdout().is_terminal() && !json;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Each command has the admin connection's timeout; this bounds a frame.
    let most = interval.max(Duration::from_secs(10));
    let mut failed = 0;
    loop {
        tick.tick().await;
        let text = match tokio::time::timeout(most, top.frame()).await {
            Ok(Ok(frame)) if json => {
                failed = 0;
                serde_json::to_string(&frame).map_err(|e| (1, e.to_string()))?
            }
            Ok(Ok(frame)) => {
                failed = 0;
                frame.to_string()
            }
            Ok(Err(e)) => {
                failed += 1;
                let e = printable(&e.to_string());
                match json {
                    true => serde_json::json!({ "error": e }).to_string(),
                    false => format!("fleetlimit top: {e}; trying again\n"),
                }
            }
            Err(_) => {
                failed += 1;
                let e = format!("no frame within {}", format_duration(most));
                match json {
                    true => serde_json::json!({ "error": e }).to_string(),
                    false => format!("fleetlimit top: {e}; trying again\n"),
                }
            }
        };
        if failed >= FAILED_FRAMES {
            return Err((
                1,
                format!("no frame in {FAILED_FRAMES} refreshes in a row; giving up"),
            ));
        }
        let text = if clear {
            format!("\x1b[2J\x1b[H{text}")
        } else {
            text + "\n"
        };
        if write_out(text.as_bytes()).is_err() {
            // Stdout closed (`| head`): done.
            return Ok(());
        }
    }
}
