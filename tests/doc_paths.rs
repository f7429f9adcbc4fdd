//! Every repository path the docs name exists: the README, each Markdown
//! file under `docs/`, and the crate's module docs (`//!` lines of every file in
//! `src/`). A file moved or removed without its mentions fails here, with
//! the document, the line and the path.
//!
//! What is read as a path:
//!
//! - a name that starts at one of the repository's folders (`src/…`,
//!   `lua/…`, `tests/…`, `benches/…`, `examples/…`, `docs/…`), from the
//!   repository's root; `*` matches within one name (`tests/chaos_*.rs`);
//! - a module's file or folder (`breaker.rs`, `store/redis/batch.rs`,
//!   `pipeline/`): in the README and `docs/`, from `src/`; in a module
//!   doc, from the module's own folder or any folder above it up to `src/`
//!   (`share.rs` in `region/mod.rs` is `src/region/share.rs`; `route.rs` in
//!   `lib.rs` is `src/route.rs`, whether or not a `route/mod.rs` exists);
//! - a Markdown link's target (`[regions](regions.md)`), from the
//!   document's folder.
//!
//! URLs, absolute paths and names inside other words (`crate::config`,
//! `https://…/src/…`) are not paths of this repository and are skipped.
//! Run it with `cargo test --test suite doc_paths::`.

use std::path::{Path, PathBuf};

/// The folders a repository path starts with.
const ROOTS: [&str; 6] = ["src/", "lua/", "tests/", "benches/", "examples/", "docs/"];

/// One document and where its relative names are looked up.
struct Doc {
    /// Its path from the repository's root, for the messages.
    name: String,
    /// Its text as (line number, line) pairs: every line of a Markdown
    /// file, the `//!` lines of a Rust file.
    lines: Vec<(usize, String)>,
    /// The folders (from the root) a module's `x.rs`, `x/y.rs` or `x/`
    /// is looked up in, first match wins.
    module_bases: Vec<PathBuf>,
    /// The folder a Markdown link's relative target is read from; `None`
    /// for Rust docs (rustdoc links are checked by rustdoc).
    link_base: Option<PathBuf>,
}

impl Doc {
    /// The README or a file in `docs/`, named by its path from the root.
    fn markdown(name: &str, text: &str) -> Doc {
        let dir = Path::new(name).parent().unwrap_or(Path::new("")).to_owned();
        Doc {
            name: name.to_owned(),
            lines: text
                .lines()
                .enumerate()
                .map(|(i, l)| (i + 1, l.to_owned()))
                .collect(),
            module_bases: vec![PathBuf::from("src")],
            link_base: Some(dir),
        }
    }

    /// A file of `src/`: its `//!` lines, resolved from its module's folder
    /// upwards.
    fn module(name: &str, text: &str) -> Doc {
        let file = Path::new(name);
        let dir = file.parent().unwrap_or(Path::new("src"));
        let mut bases = Vec::new();
        // `pipeline/decide.rs` is the module `decide`; its children, if it
        // had any, would sit in `pipeline/decide/`.
        let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        if !matches!(stem, "mod" | "lib" | "main") {
            bases.push(dir.join(stem));
        }
        for d in dir.ancestors() {
            bases.push(d.to_owned());
            if d == Path::new("src") {
                break;
            }
        }
        Doc {
            name: name.to_owned(),
            lines: text
                .lines()
                .enumerate()
                .filter_map(|(i, l)| {
                    let doc = l.trim_start().strip_prefix("//!")?;
                    Some((i + 1, doc.to_owned()))
                })
                .collect(),
            module_bases: bases,
            link_base: None,
        }
    }
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | '*')
}

/// Does `name` match `pattern`, where `*` is any run of characters?
fn wildcard(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            let Some(rest) = name.strip_prefix(head) else {
                return false;
            };
            (0..=rest.len())
                .filter(|&i| rest.is_char_boundary(i))
                .any(|i| wildcard(tail, &rest[i..]))
        }
    }
}

/// Does `rel` (from `root`; `*` within a name; a trailing `/` for a folder)
/// name something that exists?
fn exists(root: &Path, rel: &str) -> bool {
    let folder = rel.ends_with('/');
    let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
    let mut found = vec![root.to_owned()];
    for part in parts {
        let mut next = Vec::new();
        for dir in &found {
            if part.contains('*') {
                let Ok(entries) = std::fs::read_dir(dir) else {
                    continue;
                };
                for e in entries.flatten() {
                    if wildcard(part, &e.file_name().to_string_lossy()) {
                        next.push(e.path());
                    }
                }
            } else {
                let p = dir.join(part);
                if p.exists() {
                    next.push(p);
                }
            }
        }
        found = next;
    }
    found.iter().any(|p| !folder || p.is_dir())
}

/// A module's file or folder as a doc writes it: `x.rs`, `x/y.rs`, `x/`,
/// every name snake case (which `TCP/IP/` or `10/s` are not).
fn is_module_name(t: &str) -> bool {
    let body = if let Some(b) = t.strip_suffix(".rs") {
        b
    } else if let Some(b) = t.strip_suffix('/') {
        b
    } else {
        return false;
    };
    !body.is_empty()
        && body.split('/').all(|seg| {
            seg.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                && seg
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '*')
        })
}

/// The Markdown link targets of a line: `](target)`, without its
/// `#anchor`; URLs and anchors alone are left out.
fn link_targets(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let end = rest.find([')', ' ']).unwrap_or(rest.len());
        let target = &rest[..end];
        let target = target.split('#').next().unwrap_or("");
        if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
            out.push(target);
        }
        rest = &rest[end..];
    }
    out
}

/// The paths `doc` names that do not exist under `root`, as
/// `name:line: path`.
fn stale_paths(root: &Path, doc: &Doc) -> Vec<String> {
    let mut stale = Vec::new();
    for (n, line) in &doc.lines {
        let mut missing = |path: &str| stale.push(format!("{}:{n}: {path}", doc.name));
        let chars: Vec<(usize, char)> = line.char_indices().collect();
        let mut i = 0;
        while i < chars.len() {
            if !is_path_char(chars[i].1) {
                i += 1;
                continue;
            }
            let start = chars[i].0;
            let before = line[..start].chars().next_back();
            while i < chars.len() && is_path_char(chars[i].1) {
                i += 1;
            }
            let end = chars.get(i).map_or(line.len(), |c| c.0);
            // Inside a URL (`…/src/x`), an absolute or home path, a
            // variable, a Rust path (`crate::src`): not ours.
            if matches!(before, Some(':' | '/' | '@' | '~' | '$' | '\\')) {
                continue;
            }
            let token = line[start..end].trim_end_matches('.');
            let token = token.strip_prefix("./").unwrap_or(token);
            if token.starts_with('.') || token.starts_with('/') {
                continue;
            }
            if ROOTS.iter().any(|r| token.starts_with(r)) {
                if !exists(root, token) {
                    missing(token);
                }
            } else if is_module_name(token)
                && !doc
                    .module_bases
                    .iter()
                    .any(|b| exists(root, &format!("{}/{token}", b.display())))
            {
                missing(token);
            }
        }
        if let Some(base) = &doc.link_base {
            for target in link_targets(line) {
                let target = target.strip_prefix("./").unwrap_or(target);
                if !exists(&root.join(base), target) {
                    missing(target);
                }
            }
        }
    }
    stale
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every file under `dir`, at any depth, whose extension is `ext`.
fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            files(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
}

/// The README, every Markdown file under `docs/`, every file of `src/`.
fn documents() -> Vec<Doc> {
    let root = root();
    let mut docs = vec![Doc::markdown("README.md", &read("README.md"))];
    let mut md = Vec::new();
    files(&root.join("docs"), "md", &mut md);
    md.sort();
    for p in md {
        let rel = p.strip_prefix(&root).expect("under the root");
        let rel = rel.to_string_lossy().into_owned();
        docs.push(Doc::markdown(&rel, &read(&rel)));
    }
    let mut rs = Vec::new();
    files(&root.join("src"), "rs", &mut rs);
    rs.sort();
    for p in rs {
        let rel = p.strip_prefix(&root).expect("under the root");
        let rel = rel.to_string_lossy().into_owned();
        docs.push(Doc::module(&rel, &read(&rel)));
    }
    docs
}

#[test]
fn every_path_the_readme_the_docs_and_the_module_docs_name_exists() {
    let root = root();
    let stale: Vec<String> = documents()
        .iter()
        .flat_map(|d| stale_paths(&root, d))
        .collect();
    assert!(
        stale.is_empty(),
        "paths named in the docs that do not exist:\n{}",
        stale.join("\n")
    );
}

#[test]
fn a_readme_naming_a_missing_file_fails() {
    let mut text = read("README.md");
    let before = stale_paths(&root(), &Doc::markdown("README.md", &text));
    text.push_str("\nThe spine is in `src/no_such_file.rs`.\n");
    let mut after = stale_paths(&root(), &Doc::markdown("README.md", &text));
    let last = text.lines().count();
    assert_eq!(
        after.pop(),
        Some(format!("README.md:{last}: src/no_such_file.rs"))
    );
    assert_eq!(after, before);
}

#[test]
fn paths_from_the_root_are_checked_with_their_wildcards_and_folders() {
    let doc = Doc::markdown(
        "README.md",
        "`tests/chaos_*.rs`, `docs/bench/`, `lua/decide.lua`, src/lib.rs.\n\
         `tests/chaos_nothing_*.rs`, `lua/gone.lua`, `src/lib.rs/`\n",
    );
    assert_eq!(
        stale_paths(&root(), &doc),
        [
            "README.md:2: tests/chaos_nothing_*.rs",
            "README.md:2: lua/gone.lua",
            "README.md:2: src/lib.rs/"
        ]
    );
}

#[test]
fn module_names_in_the_docs_are_read_from_src() {
    let doc = Doc::markdown(
        "docs/architecture.md",
        "`breaker.rs`, `store/redis/batch.rs`, `region/` hold; `batch.rs` alone is not in src/\n",
    );
    assert_eq!(
        stale_paths(&root(), &doc),
        ["docs/architecture.md:1: batch.rs"]
    );
}

#[test]
fn a_module_doc_names_files_from_its_folder_upwards() {
    let doc = Doc::module(
        "src/region/mod.rs",
        "//! `share.rs`, `breaker.rs` and `store/` exist\n\
         //! `demand.rs` does not\n\
         // `nor_this.rs`, which is no doc\n",
    );
    assert_eq!(
        stale_paths(&root(), &doc),
        ["src/region/mod.rs:2: demand.rs"]
    );
}

#[test]
fn links_are_read_from_the_documents_folder() {
    let doc = Doc::markdown(
        "docs/architecture.md",
        "[regions](regions.md#the-bound), [home](https://example.com/src/x.rs), \
         [up](../README.md), [gone](gone.md), [anchor](#here)\n",
    );
    assert_eq!(
        stale_paths(&root(), &doc),
        ["docs/architecture.md:1: gone.md"]
    );
}

#[test]
fn urls_absolute_paths_and_rust_paths_are_not_repository_paths() {
    let doc = Doc::markdown(
        "README.md",
        "https://github.com/a/b/tree/src/gone.rs /proc/self/task/*/schedstat \
         crate::src ~/src/gone.rs $HOME/tests/gone 10/s TCP/IP/\n",
    );
    assert_eq!(stale_paths(&root(), &doc), Vec::<String>::new());
}
