//! The crate's modules form no import cycle: reading `src/`, every file's
//! `crate::…`, `super::…` and `self::…` paths are resolved to the file that
//! defines the module they name, and the resulting graph must be acyclic.
//!
//! The same holds between the crate's top-level modules (a file of
//! `pipeline/` importing `refused.rs` while `refused.rs` imports
//! `answer/rate.rs` is a cycle of `pipeline` and `refused`).
//!
//! A parent's `mod child;` and its `pub use` re-exports of its own
//! descendants are how Rust exposes a module, not a dependency, and do not
//! count; unit tests (`#[cfg(test)]` onwards, `tests` modules) are left out.
//! Run it with `cargo test --test suite layering::`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path, e.g. `["store", "redis", "batch"]`; `[]` is `lib.rs`.
type ModPath = Vec<String>;

fn module_of(src: &Path, file: &Path) -> Option<ModPath> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.first().map(String::as_str) == Some("bin") {
        return None; // the binary is a crate of its own
    }
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_owned());
    }
    if parts.iter().any(|p| p == "tests") {
        return None;
    }
    Some(parts)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its unit tests, comments and string literals.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    };
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_str = false;
        let mut prev = ' ';
        let mut kept = String::new();
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if !in_str && c == '/' && chars.get(i + 1) == Some(&'/') {
                break;
            }
            if c == '"' && prev != '\\' {
                in_str = !in_str;
            } else if !in_str {
                kept.push(c);
            }
            prev = if prev == '\\' && c == '\\' { ' ' } else { c };
            i += 1;
        }
        out.push_str(&kept);
        out.push('\n');
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Expands a use tree starting at `s` (after `prefix::`) into paths.
fn tree(s: &[char], i: &mut usize, base: &[String], out: &mut Vec<Vec<String>>) {
    skip_ws(s, i);
    if s.get(*i) == Some(&'{') {
        *i += 1;
        loop {
            skip_ws(s, i);
            match s.get(*i) {
                Some('}') => {
                    *i += 1;
                    return;
                }
                Some(',') => *i += 1,
                None => return,
                _ => {
                    let before = *i;
                    tree(s, i, base, out);
                    if *i == before {
                        *i += 1;
                    }
                }
            }
        }
    }
    let start = *i;
    while *i < s.len() && is_ident(s[*i]) {
        *i += 1;
    }
    if start == *i {
        if s.get(*i) == Some(&'*') {
            *i += 1;
        }
        out.push(base.to_vec());
        return;
    }
    let mut path = base.to_vec();
    path.push(s[start..*i].iter().collect());
    let mut j = *i;
    skip_ws(s, &mut j);
    if s.get(j) == Some(&':') && s.get(j + 1) == Some(&':') {
        *i = j + 2;
        tree(s, i, &path, out);
    } else {
        out.push(path);
    }
}

fn skip_ws(s: &[char], i: &mut usize) {
    while *i < s.len() && s[*i].is_whitespace() {
        *i += 1;
    }
}

/// Every module path the code names, each with whether it was named by a
/// `pub use` (a re-export).
fn named_paths(me: &ModPath, is_mod_file: bool, code: &str) -> Vec<(ModPath, bool)> {
    let s: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let boundary = i == 0 || !is_ident(s[i - 1]) && s[i - 1] != ':';
        let rest: String = s[i..(i + 7).min(s.len())].iter().collect();
        let (base, len): (Option<ModPath>, usize) = if !boundary {
            (None, 0)
        } else if rest.starts_with("crate::") {
            (Some(Vec::new()), 7)
        } else if rest.starts_with("super::") {
            // `super` of a mod.rs/leaf file: the parent module.
            let mut b = me.clone();
            b.pop();
            let _ = is_mod_file;
            (Some(b), 7)
        } else if rest.starts_with("self::") {
            (Some(me.clone()), 6)
        } else {
            (None, 0)
        };
        let Some(mut base) = base else {
            i += 1;
            continue;
        };
        let mut j = i + len;
        // `super::super::…`
        loop {
            let r: String = s[j..(j + 7).min(s.len())].iter().collect();
            if r.starts_with("super::") {
                base.pop();
                j += 7;
            } else {
                break;
            }
        }
        let line_start = s[..i].iter().rposition(|&c| c == '\n').map_or(0, |p| p + 1);
        let stmt: String = s[line_start..i].iter().collect();
        let reexport = stmt.trim_start().starts_with("pub use")
            || stmt.trim_start().starts_with("pub(crate) use");
        let mut paths = Vec::new();
        tree(&s, &mut j, &base, &mut paths);
        found.extend(paths.into_iter().map(|p| (p, reexport)));
        i = j.max(i + 1);
    }
    found
}

#[test]
fn no_module_imports_itself_through_a_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut modules: BTreeMap<ModPath, PathBuf> = BTreeMap::new();
    for f in &files {
        if let Some(m) = module_of(&src, f) {
            modules.insert(m, f.clone());
        }
    }
    assert!(modules.len() > 10, "read too few modules: {modules:?}");

    let mut edges: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (me, file) in &modules {
        let text = std::fs::read_to_string(file).expect("read source");
        let is_mod_file = file.ends_with("mod.rs") || file.ends_with("lib.rs");
        for (path, reexport) in named_paths(me, is_mod_file, &code(&text)) {
            // The file defining the longest prefix of the path.
            let target = (0..=path.len())
                .rev()
                .map(|n| path[..n].to_vec())
                .find(|p| modules.contains_key(p));
            let Some(target) = target else { continue };
            let descendant = target.len() > me.len() && target.starts_with(me);
            if target == *me || target.is_empty() || (reexport && descendant) {
                continue;
            }
            edges.entry(me.clone()).or_default().insert(target);
        }
    }
    assert!(
        edges.values().map(BTreeSet::len).sum::<usize>() > 20,
        "found too few imports to be reading the code: {edges:?}"
    );

    // Depth-first search for a back edge.
    fn visit(
        m: &ModPath,
        edges: &BTreeMap<ModPath, BTreeSet<ModPath>>,
        state: &mut BTreeMap<ModPath, u8>,
        stack: &mut Vec<ModPath>,
        cycles: &mut Vec<String>,
    ) {
        state.insert(m.clone(), 1);
        stack.push(m.clone());
        for n in edges.get(m).into_iter().flatten() {
            match state.get(n).copied().unwrap_or(0) {
                0 => visit(n, edges, state, stack, cycles),
                1 => {
                    let from = stack.iter().position(|x| x == n).unwrap_or(0);
                    let names: Vec<String> = stack[from..]
                        .iter()
                        .chain(std::iter::once(n))
                        .map(|p| format!("crate::{}", p.join("::")))
                        .collect();
                    cycles.push(names.join(" → "));
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(m.clone(), 2);
    }
    let find_cycles = |edges: &BTreeMap<ModPath, BTreeSet<ModPath>>| {
        let mut state = BTreeMap::new();
        let mut cycles = Vec::new();
        for m in edges.keys() {
            if state.get(m).copied().unwrap_or(0) == 0 {
                visit(m, edges, &mut state, &mut Vec::new(), &mut cycles);
            }
        }
        cycles
    };
    // Between files…
    let cycles = find_cycles(&edges);
    assert!(
        cycles.is_empty(),
        "import cycles between files:\n{}",
        cycles.join("\n")
    );
    // …and between the crate's top-level modules (`pipeline`, `store`, …).
    let mut top: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (from, to) in &edges {
        for t in to {
            if from[0] != t[0] {
                top.entry(vec![from[0].clone()])
                    .or_default()
                    .insert(vec![t[0].clone()]);
            }
        }
    }
    let cycles = find_cycles(&top);
    assert!(
        cycles.is_empty(),
        "import cycles between top-level modules:\n{}",
        cycles.join("\n")
    );
}
