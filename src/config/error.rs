use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// A configuration problem, reported at start-up: what is wrong and where.
///
/// Displayed as `file:line:column: message` when the problem has a place in
/// a file, so editors and CI logs can jump to it.
///
/// ```
/// use fleetlimit::Config;
///
/// let err = Config::from_toml_str("[limits.api]\nkey = \"header:x-api-key\"\ncapacity = 0\nrefill = \"1/s\"\n")
///     .unwrap_err();
/// assert_eq!(err.line(), Some(3));
/// eprintln!("{err}"); // 3:12: ...
/// ```
///
/// Its `Debug` is its `Display`, so that `main` returning
/// `Result<(), Box<dyn Error>>` through `?` prints
/// `Error: fleetlimit.toml:3:1: unknown field …`, not the struct's fields.
#[derive(Clone, PartialEq, Eq)]
pub struct ConfigError {
    file: Option<PathBuf>,
    position: Option<(usize, usize)>,
    message: String,
}

impl ConfigError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self {
            file: None,
            position: None,
            message: message.into(),
        }
    }

    /// An error at `span` (byte offsets) of `source`.
    pub(crate) fn at(source: &str, span: Option<Range<usize>>, message: impl Into<String>) -> Self {
        Self {
            file: None,
            position: span.map(|s| line_col(source, s.start)),
            message: message.into(),
        }
    }

    /// An error at a `(line, column)` found earlier (see [`position`]).
    pub(crate) fn placed(position: Option<(usize, usize)>, message: impl Into<String>) -> Self {
        Self {
            file: None,
            position,
            message: message.into(),
        }
    }

    pub(crate) fn in_file(mut self, file: &Path) -> Self {
        self.file = Some(file.to_path_buf());
        self
    }

    /// The file the error is in, when it came from one.
    #[must_use]
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// 1-based line of the problem, when it has a place.
    #[must_use]
    pub fn line(&self) -> Option<usize> {
        self.position.map(|p| p.0)
    }

    /// 1-based column (in characters) of the problem, when it has a place.
    #[must_use]
    pub fn column(&self) -> Option<usize> {
        self.position.map(|p| p.1)
    }

    /// What is wrong.
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// A number as a person reads it: `1e300`, not its 301 digits.
pub(crate) fn short_number(v: f64) -> String {
    let plain = v.to_string();
    if plain.len() > 20 {
        format!("{v:e}")
    } else {
        plain
    }
}

/// The TOML parser's message in the words of the file: its Rust type names
/// (`expected u32`) as the bounds they stand for, a long float as `1e300`.
pub(crate) fn toml_message(message: &str) -> String {
    let mut m = message.to_owned();
    for (rust, words) in [
        (
            "expected u32",
            "expected a whole number from 0 to 4294967295",
        ),
        ("expected u64", "expected a whole number from 0 to 2^64 - 1"),
        (
            "expected usize",
            "expected a whole number from 0 to 2^64 - 1",
        ),
        ("expected u16", "expected a whole number from 0 to 65535"),
        ("expected u8", "expected a whole number from 0 to 255"),
        ("expected i64", "expected a whole number"),
        ("expected f64", "expected a number"),
    ] {
        m = m.replace(rust, words);
    }
    if m.trim() == "number too large to fit in target type" {
        m = "a number too large for TOML (whole numbers are at most 2^63 - 1; counts at most 2^53)"
            .into();
    }
    // `floating point `1000…0.0``: its digits, shortened.
    if let Some(start) = m
        .find("floating point `")
        .map(|i| i + "floating point `".len())
    {
        if let Some(len) = m[start..].find('`') {
            if let Ok(v) = m[start..start + len].parse::<f64>() {
                m.replace_range(start..start + len, &short_number(v));
            }
        }
    }
    m
}

/// The 1-based `(line, column)` of `span` in `source`, kept for an error
/// found after the source is gone (a layer built without a custom key's
/// extractor).
pub(crate) fn position(source: &str, span: Option<Range<usize>>) -> Option<(usize, usize)> {
    span.map(|s| line_col(source, s.start))
}

fn line_col(source: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(source.len());
    let before = &source[..source.floor_char_boundary_compat(offset)];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

trait FloorCharBoundary {
    fn floor_char_boundary_compat(&self, i: usize) -> usize;
}

impl FloorCharBoundary for str {
    fn floor_char_boundary_compat(&self, mut i: usize) -> usize {
        while !self.is_char_boundary(i) {
            i -= 1;
        }
        i
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, self.position) {
            (Some(file), Some((l, c))) => write!(f, "{}:{l}:{c}: ", file.display())?,
            (None, Some((l, c))) => write!(f, "line {l}, column {c}: ")?,
            (Some(file), None) => write!(f, "{}: ", file.display())?,
            (None, None) => {}
        }
        f.write_str(&self.message)
    }
}

impl fmt::Debug for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_one_based_characters() {
        assert_eq!(line_col("abc", 0), (1, 1));
        assert_eq!(line_col("a\nbc", 3), (2, 2));
        assert_eq!(line_col("é\néé", 5), (2, 2));
        let e = ConfigError::at("x\ny", Some(2..3), "bad").in_file(Path::new("f.toml"));
        assert_eq!(e.to_string(), "f.toml:2:1: bad");
    }
}
