//! `application/problem+json` bodies (RFC 9457) of refusals that are
//! written once per limit, apart from the request path's modules: a route
//! keeps its limits' bodies, and the response builder reads them.

use std::cell::RefCell;
use std::fmt;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use bytes::Bytes;
use http::StatusCode;

/// The problem type of a refusal by a rate limit.
pub(crate) const RATE_LIMITED: &str = "urn:fleetlimit:rate-limited";

/// Appends `s` as a JSON string literal.
pub(crate) fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    // Runs of characters that need no escape are copied whole.
    let mut from = 0;
    for (i, b) in s.bytes().enumerate() {
        if b != b'"' && b != b'\\' && b >= 0x20 {
            continue;
        }
        out.push_str(&s[from..i]);
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            _ => {
                let _ = write!(out, "\\u{:04x}", b);
            }
        }
        from = i + 1;
    }
    out.push_str(&s[from..]);
    out.push('"');
}

/// Slots of each thread's [`RECENT`] bodies.
const RECENT_SLOTS: usize = 16;

thread_local! {
    /// Bodies of waits longer than [`KEPT_BODIES`] s built lately on this
    /// thread, by limit id and wait: a handful per thread, whatever the
    /// traffic.
    static RECENT: RefCell<[Option<(u64, u64, Bytes)>; RECENT_SLOTS]> =
        const { RefCell::new([const { None }; RECENT_SLOTS]) };
}

/// How many `Retry-After` values each limit keeps its `429` body for.
const KEPT_BODIES: usize = 64;

/// A limit's `429` bodies: the text around the two `Retry-After` numbers
/// is written once, and the bodies of waits of 1 to [`KEPT_BODIES`] s are
/// kept once built and shared (a clone is a reference count): a refused
/// client is told the same few numbers again and again. Longer waits are
/// one allocation each, unless the thread built the same one lately.
pub(crate) struct RefusalBodies {
    /// Unique in the process: names this limit's bodies in each thread's
    /// [`RECENT`] (an address could be reused by a later limit).
    id: u64,
    /// Up to the number in `detail`.
    head: Box<str>,
    /// From after that number to the one of `retry_after`.
    mid: Box<str>,
    kept: Box<[OnceLock<Bytes>; KEPT_BODIES]>,
}

impl fmt::Debug for RefusalBodies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kept = self.kept.iter().filter(|b| b.get().is_some()).count();
        write!(f, "RefusalBodies({kept} kept)")
    }
}

impl RefusalBodies {
    /// The bodies of limit `name`: what a `problem+json` body of the limit
    /// reads (see `pipeline/response.rs`).
    pub(crate) fn new(name: &str) -> Self {
        let status = StatusCode::TOO_MANY_REQUESTS;
        let mut head = String::new();
        head.push_str("{\"type\":");
        push_json_str(&mut head, RATE_LIMITED);
        head.push_str(",\"title\":");
        push_json_str(&mut head, status.canonical_reason().unwrap_or(""));
        head.push_str(",\"status\":");
        head.push_str(status.as_str());
        head.push_str(",\"detail\":");
        // The number is digits, escaped as itself: the detail's JSON is its
        // parts' JSON, quotes aside.
        let mut detail = String::new();
        push_json_str(
            &mut detail,
            &format!("rate limit {name:?} exceeded; retry in "),
        );
        head.push_str(&detail[..detail.len() - 1]);
        let mut mid = String::new();
        push_json_str(&mut mid, " s");
        mid.remove(0);
        mid.push_str(",\"limit\":");
        push_json_str(&mut mid, name);
        mid.push_str(",\"retry_after\":");
        static IDS: AtomicU64 = AtomicU64::new(0);
        Self {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            head: head.into(),
            mid: mid.into(),
            kept: Box::new(std::array::from_fn(|_| OnceLock::new())),
        }
    }

    /// The `429` body for a wait of `retry` seconds.
    pub(crate) fn get(&self, retry: u64) -> Bytes {
        let kept = usize::try_from(retry)
            .ok()
            .and_then(|r| self.kept.get(r.wrapping_sub(1)));
        match kept {
            Some(cell) => cell.get_or_init(|| self.build(retry)).clone(),
            None => self.recent(retry),
        }
    }

    /// A longer wait's body: the one this thread built last for the same
    /// limit and wait, if still in its slot (a client hammering a limit is
    /// told the same wait for a whole second), else a new one.
    fn recent(&self, retry: u64) -> Bytes {
        RECENT.with(|recent| {
            let mut recent = recent.borrow_mut();
            let slot = &mut recent[((self.id ^ retry) % RECENT_SLOTS as u64) as usize];
            match slot {
                Some((id, r, body)) if *id == self.id && *r == retry => body.clone(),
                _ => slot.insert((self.id, retry, self.build(retry))).2.clone(),
            }
        })
    }

    fn build(&self, retry: u64) -> Bytes {
        let mut digits = [0u8; 20];
        let n = decimal(retry, &mut digits);
        let mut body = String::with_capacity(self.head.len() + self.mid.len() + 2 * n.len() + 1);
        body.push_str(&self.head);
        body.push_str(n);
        body.push_str(&self.mid);
        body.push_str(n);
        body.push('}');
        Bytes::from(body)
    }
}

/// `n` in decimal, written at the end of `buf`.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &str {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    std::str::from_utf8(&buf[at..]).unwrap_or("0")
}
