//! What Redis holds, read as the scripts read it: a token bucket's 8-byte
//! TAT, Lua 5.1's `tonumber` for text, and the state each algorithm takes
//! as valid (anything else is absent).

/// A stored key as the limiter takes it ([`Rule::read_stored`]).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Stored {
    /// No key: a full bucket.
    Absent,
    /// A state the scripts accept: what it leaves (tokens, requests or
    /// slots, from 0 to the capacity), and in words.
    Valid { remaining: f64, text: String },
    /// Not a state the scripts accept: the limiter takes it as absent (a
    /// full bucket) and overwrites or deletes it at the key's next check.
    Invalid,
}

impl Stored {
    /// What the key leaves, as the limiter decides: a full bucket unless
    /// the state is valid.
    pub(crate) fn remaining(&self, capacity: f64) -> f64 {
        match self {
            Self::Valid { remaining, .. } => *remaining,
            Self::Absent | Self::Invalid => capacity,
        }
    }
}

/// What the words say for an invalid state, everywhere the admin tools
/// show one.
pub(crate) const INVALID_STATE: &str = "invalid state (taken as absent by the limiter)";

/// A token bucket's stored TAT as the scripts read it (`tat_read` in
/// `lua/token_bucket.lua`): 8 bytes are a little-endian double (what they
/// write), any other length decimal text as Lua's `tonumber` reads it (what
/// earlier code wrote). `None`: no number.
pub(crate) fn stored_number(raw: &[u8]) -> Option<f64> {
    match <[u8; 8]>::try_from(raw) {
        Ok(bytes) => Some(f64::from_le_bytes(bytes)),
        Err(_) => lua_number(&String::from_utf8_lossy(raw)),
    }
}

/// A string as Lua 5.1's `tonumber` reads it, which is how the scripts
/// read a stored value: C's `strtod` (decimal, hexadecimal `0x…` with an
/// optional `p` exponent, `inf`, `nan`) over the text up to its first NUL
/// byte, white space (C's `isspace`) allowed before and after. `None`
/// where `tonumber` answers nil.
pub(crate) fn lua_number(raw: &str) -> Option<f64> {
    let text = raw.split('\0').next().unwrap_or("");
    let is_space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r');
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() && is_space(b[i]) {
        i += 1;
    }
    let start = i;
    if i < b.len() && matches!(b[i], b'+' | b'-') {
        i += 1;
    }
    let negative = b.get(start) == Some(&b'-');
    let body = i;
    let rest = &text[body..];
    let lower = rest.get(..8).unwrap_or(rest).to_ascii_lowercase();
    let (value, end) = if lower.starts_with("inf") {
        let n = if lower.starts_with("infinity") { 8 } else { 3 };
        (f64::INFINITY, body + n)
    } else if lower.starts_with("nan") {
        let mut end = body + 3;
        // `nan(chars)`: strtod takes the parenthesised part too.
        if b.get(end) == Some(&b'(') {
            if let Some(close) = text[end..].find(')') {
                let inner = &text[end + 1..end + close];
                if inner
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'_')
                {
                    end += close + 1;
                }
            }
        }
        (f64::NAN, end)
    } else if rest.len() > 2 && (rest.starts_with("0x") || rest.starts_with("0X")) {
        match hex_float(&b[body + 2..]) {
            Some((v, used)) => (v, body + 2 + used),
            // "0x" with no digit after it: strtod reads the "0" alone.
            None => (0.0, body + 1),
        }
    } else {
        let mut j = body;
        let digits = |j: &mut usize| {
            let from = *j;
            while *j < b.len() && b[*j].is_ascii_digit() {
                *j += 1;
            }
            *j - from
        };
        let mut n = digits(&mut j);
        if j < b.len() && b[j] == b'.' {
            j += 1;
            n += digits(&mut j);
        }
        if n == 0 {
            return None;
        }
        if j < b.len() && matches!(b[j], b'e' | b'E') {
            let mut k = j + 1;
            if k < b.len() && matches!(b[k], b'+' | b'-') {
                k += 1;
            }
            if digits(&mut k) > 0 {
                j = k;
            }
        }
        (text[body..j].parse::<f64>().ok()?, j)
    };
    if !text.as_bytes()[end..].iter().all(|&c| is_space(c)) {
        return None;
    }
    Some(if negative { -value } else { value })
}

/// The hexadecimal digits (with a fraction and a `p` exponent) at the
/// start of `b`: the value and the bytes used; `None` without a digit.
fn hex_float(b: &[u8]) -> Option<(f64, usize)> {
    let hex = |c: u8| (c as char).to_digit(16).map(f64::from);
    let (mut value, mut i, mut n, mut scale) = (0.0_f64, 0, 0, 0_i32);
    while let Some(d) = b.get(i).copied().and_then(hex) {
        value = value * 16.0 + d;
        i += 1;
        n += 1;
    }
    if b.get(i) == Some(&b'.') {
        i += 1;
        while let Some(d) = b.get(i).copied().and_then(hex) {
            value = value * 16.0 + d;
            scale -= 4;
            i += 1;
            n += 1;
        }
    }
    if n == 0 {
        return None;
    }
    if matches!(b.get(i), Some(b'p' | b'P')) {
        let mut k = i + 1;
        let sign = match b.get(k) {
            Some(b'-') => {
                k += 1;
                -1
            }
            Some(b'+') => {
                k += 1;
                1
            }
            _ => 1,
        };
        let from = k;
        let mut e: i32 = 0;
        while let Some(d) = b.get(k).filter(|c| c.is_ascii_digit()) {
            e = e.saturating_mul(10).saturating_add(i32::from(d - b'0'));
            k += 1;
        }
        if k > from {
            scale = scale.saturating_add(sign * e);
            i = k;
        }
    }
    Some((value * 2f64.powi(scale), i))
}
