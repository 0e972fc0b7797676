//! What the tidy checks read of Rust source: the code with its comments,
//! strings and character literals blanked out (so braces and paths in them
//! do not count), the functions and where their bodies run, and which of a
//! crate's top-level modules each file names.
//!
//! A lexer, not a parser: good enough for a lint over our own tree, which
//! rustfmt keeps regular; it does not understand macros' own syntax.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// `text` with every comment, string, byte string, raw string and character
/// literal replaced by spaces (line breaks kept, so lines still count).
pub(crate) fn code_only(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while at < bytes.len() {
        let end = literal_or_comment_end(bytes, at);
        if end > at {
            out.extend(
                text[at..end]
                    .chars()
                    .map(|ch| if ch == '\n' { '\n' } else { ' ' }),
            );
            at = end;
        } else {
            let ch = text[at..]
                .chars()
                .next()
                .expect("at is on a character boundary");
            out.push(ch);
            at += ch.len_utf8();
        }
    }
    out
}

/// Where the comment or literal starting at `at` ends, or `at` when none starts there.
fn literal_or_comment_end(bytes: &[u8], at: usize) -> usize {
    let rest = &bytes[at..];
    let previous_is_ident =
        at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
    if rest.starts_with(b"//") {
        return find_from(bytes, at, b"\n").unwrap_or(bytes.len());
    }
    if rest.starts_with(b"/*") {
        return find_from(bytes, at + 2, b"*/").map_or(bytes.len(), |end| end + 2);
    }
    if !previous_is_ident {
        let raw = if rest.starts_with(b"br") {
            2
        } else if rest.starts_with(b"r") {
            1
        } else {
            0
        };
        let hashes = rest[raw..].iter().take_while(|byte| **byte == b'#').count();
        if raw > 0 && rest.get(raw + hashes) == Some(&b'"') {
            let mut closing = vec![b'"'];
            closing.extend(std::iter::repeat_n(b'#', hashes));
            return find_from(bytes, at + raw + hashes + 1, &closing)
                .map_or(bytes.len(), |end| end + closing.len());
        }
    }
    let quoted = if rest.starts_with(b"b\"") && !previous_is_ident {
        Some(1)
    } else if rest.starts_with(b"\"") {
        Some(0)
    } else {
        None
    };
    if let Some(prefix) = quoted {
        let mut index = at + prefix + 1;
        while index < bytes.len() && bytes[index] != b'"' {
            index += if bytes[index] == b'\\' { 2 } else { 1 };
        }
        return (index + 1).min(bytes.len());
    }
    if rest.starts_with(b"'") {
        return char_literal_end(bytes, at).unwrap_or(at);
    }
    at
}

/// The end of a character literal at `at` (`'a'`, `'\n'`, `'\u{1F600}'`),
/// or `None` for a lifetime or label.
fn char_literal_end(bytes: &[u8], at: usize) -> Option<usize> {
    if bytes.get(at + 1) == Some(&b'\\') {
        let close = find_from(bytes, at + 2, b"'")?;
        return (close - at <= 12).then_some(close + 1);
    }
    let text = std::str::from_utf8(&bytes[at + 1..(at + 6).min(bytes.len())])
        .ok()
        .or_else(|| {
            (2..6)
                .rev()
                .find_map(|len| std::str::from_utf8(bytes.get(at + 1..at + len)?).ok())
        })?;
    let ch = text.chars().next()?;
    let close = at + 1 + ch.len_utf8();
    (bytes.get(close) == Some(&b'\'')).then_some(close + 1)
}

fn find_from(bytes: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    bytes
        .get(from..)?
        .windows(needle.len())
        .position(|window| window == needle)
        .map(|offset| from + offset)
}

/// A function with a body.
#[derive(Debug)]
pub(crate) struct Function {
    /// Its name.
    pub(crate) name: String,
    /// The line of `fn`, from 1.
    pub(crate) line: usize,
    /// Lines from `fn` to its closing brace, both included.
    pub(crate) lines: usize,
    /// Its body without the outer braces, code only.
    pub(crate) body: String,
}

/// Every function with a body in `code` (from [`code_only`]).
pub(crate) fn functions(code: &str) -> Vec<Function> {
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    let mut search = 0;
    while let Some(at) = find_from(bytes, search, b"fn ") {
        search = at + 3;
        let starts_word =
            at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
        let name: String = code[at + 3..]
            .chars()
            .take_while(|ch| ch.is_alphanumeric() || *ch == '_')
            .collect();
        if !starts_word || name.is_empty() {
            continue;
        }
        // The body opens at the first `{` unless a `;` (a declaration) comes first.
        let Some(open) = bytes[at..]
            .iter()
            .position(|byte| matches!(byte, b'{' | b';'))
            .map(|offset| at + offset)
        else {
            break;
        };
        if bytes[open] == b';' {
            continue;
        }
        let Some(close) = matching_brace(bytes, open) else {
            break;
        };
        let line = code[..at].matches('\n').count() + 1;
        let lines = code[at..=close].matches('\n').count() + 1;
        found.push(Function {
            name,
            line,
            lines,
            body: code[open + 1..close].to_owned(),
        });
    }
    found
}

/// The brace closing the one at `open`.
fn matching_brace(bytes: &[u8], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (index, byte) in bytes.iter().enumerate().skip(open) {
        match byte {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(index);
                }
            }
            _ => {}
        }
    }
    None
}

/// Whether `body` is one `match` whose arms are one call each: the match is
/// the body's only statement at its top level (bindings before it aside),
/// and no arm holds more than one statement.
pub(crate) fn is_dispatch_match(body: &str) -> bool {
    let trimmed = body.trim();
    let Some(start) = trimmed.find("match ") else {
        return false;
    };
    let before = &trimmed[..start];
    if before.split(';').any(|statement| {
        let statement = statement.trim();
        !statement.is_empty() && !statement.starts_with("let ")
    }) {
        return false;
    }
    let bytes = trimmed.as_bytes();
    let Some(open) = find_from(bytes, start, b"{") else {
        return false;
    };
    let Some(close) = matching_brace(bytes, open) else {
        return false;
    };
    let after = trimmed[close + 1..].trim();
    if !(after.is_empty() || after == ";" || after.starts_with(")")) {
        return false;
    }
    arms_are_single_calls(&trimmed[open + 1..close])
}

/// Whether no arm of a match body holds more than one statement (a `;`
/// inside a block arm at the arm's own level).
fn arms_are_single_calls(arms: &str) -> bool {
    let mut depth = 0i32;
    let mut statements_in_arm = 0;
    for byte in arms.bytes() {
        match byte {
            b'{' | b'(' | b'[' => depth += 1,
            b'}' | b')' | b']' => depth -= 1,
            b';' if depth == 1 => {
                statements_in_arm += 1;
                if statements_in_arm > 1 {
                    return false;
                }
            }
            b',' if depth == 0 => statements_in_arm = 0,
            _ => {}
        }
        if depth == 0 && byte == b'}' {
            statements_in_arm = 0;
        }
    }
    true
}

/// The top-level modules of the crate whose source root is `src` (a
/// `lib.rs` or `main.rs` there), each with its files.
pub(crate) fn top_modules(src: &Path) -> BTreeMap<String, Vec<(String, String)>> {
    let mut modules: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(src) else {
        return modules;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let module = if path.is_dir() {
            name.clone()
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if stem == "lib" || stem == "main" {
                continue;
            }
            stem.to_owned()
        } else {
            continue;
        };
        let mut files = Vec::new();
        if path.is_file() {
            files.push(path.clone());
        } else {
            super::rust_files(&path, &mut files);
        }
        for file in files {
            let relative = file
                .strip_prefix(src)
                .unwrap_or(&file)
                .display()
                .to_string();
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            modules
                .entry(module.clone())
                .or_default()
                .push((relative, text));
        }
    }
    modules
}

/// The top-level modules a file of `module` names, unit tests left out (a
/// `tests.rs`, a `tests/` folder, an inline `mod tests`). `crate::X` counts
/// everywhere; `super::X` only at the module's top, where `super` is the
/// crate root. A name the crate root re-exports counts as its module.
pub(crate) fn references(
    module: &str,
    relative: &str,
    text: &str,
    tops: &BTreeSet<String>,
    root_exports: &BTreeMap<String, String>,
) -> BTreeSet<String> {
    if relative.ends_with("/tests.rs") || relative.contains("/tests/") {
        return BTreeSet::new();
    }
    let code = code_only(text);
    let code = code
        .split("#[cfg(test)]\nmod tests {")
        .next()
        .unwrap_or_default();
    let at_top = !relative.contains('/')
        || relative.ends_with("/mod.rs") && relative.matches('/').count() == 1;
    let mut names = BTreeSet::new();
    for (prefix, allowed) in [("crate::", true), ("super::", at_top)] {
        if !allowed {
            continue;
        }
        for (at, _) in code.match_indices(prefix) {
            let rest = &code[at + prefix.len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let inner = group.split('}').next().unwrap_or_default();
                names.extend(inner.split(',').filter_map(|item| first_ident(item.trim())));
            } else if let Some(name) = first_ident(rest) {
                names.insert(name);
            }
        }
    }
    names
        .into_iter()
        .filter_map(|name| {
            if tops.contains(&name) {
                Some(name)
            } else {
                root_exports.get(&name).cloned()
            }
        })
        .filter(|target| target != module)
        .collect()
}

fn first_ident(text: &str) -> Option<String> {
    let name: String = text
        .chars()
        .take_while(|ch| ch.is_alphanumeric() || *ch == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// The names the crate root re-exports from its modules (`pub use
/// self::x::Name;`, `pub use crate::x::{A, B};`, `pub use x::Name;`), each
/// with the module it comes from.
pub(crate) fn root_exports(root: &str, tops: &BTreeSet<String>) -> BTreeMap<String, String> {
    let code = code_only(root);
    let mut exports = BTreeMap::new();
    for statement in code.split(';') {
        let Some(path) = statement
            .trim()
            .strip_prefix("pub use ")
            .or_else(|| statement.trim().strip_prefix("pub(crate) use "))
        else {
            continue;
        };
        let path = path
            .trim_start_matches("self::")
            .trim_start_matches("crate::");
        let Some(module) = first_ident(path) else {
            continue;
        };
        if !tops.contains(&module) {
            continue;
        }
        for name in path[module.len()..].split(|ch: char| !(ch.is_alphanumeric() || ch == '_')) {
            if !name.is_empty() && name != "self" && name != "as" {
                exports
                    .entry(name.to_owned())
                    .or_insert_with(|| module.clone());
            }
        }
    }
    exports
}

/// The modules on some cycle of `edges` (each module's imports), as sorted
/// groups: the strongly connected components of more than one module.
pub(crate) fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reaches = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_owned()];
        while let Some(module) = stack.pop() {
            for next in edges.get(&module).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&String, BTreeSet<String>> = edges
        .keys()
        .map(|module| (module, reaches(module)))
        .collect();
    let mut groups: BTreeSet<Vec<String>> = BTreeSet::new();
    for (module, reached) in &reach {
        let group: Vec<String> = reached
            .iter()
            .filter(|other| reach.get(other).is_some_and(|back| back.contains(*module)))
            .cloned()
            .collect();
        if group.len() > 1 {
            groups.insert(group);
        }
    }
    groups.into_iter().collect()
}
