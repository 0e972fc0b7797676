//! Tidy checks over the source tree: every Rust file opens with a `//!` module
//! comment saying what it is for, no source file outside tests grows past 1,000
//! lines, and unit tests follow one layout (an inline `mod tests`, or a
//! `tests.rs` in the module's folder; never a test module by `#[path]`).

use std::path::{Path, PathBuf};

/// The source folders of every package in the workspace.
const SOURCE_DIRS: [&str; 11] = [
    "src",
    "python/src",
    "runtime/src",
    "sched/src",
    "tune/src",
    "head/src",
    "node/src",
    "sdk/src",
    "examples",
    "tests",
    "benches",
];

/// The longest a source file other than tests may be.
const MAX_SOURCE_LINES: usize = 1000;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            out.push(path);
        }
    }
}

/// Every Rust file of the workspace, with its path relative to the root.
fn workspace_files() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in SOURCE_DIRS {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 20, "found only {} source files", files.len());
    files
        .iter()
        .map(|path| {
            let relative = path
                .strip_prefix(root)
                .unwrap_or(path)
                .display()
                .to_string();
            (relative, std::fs::read_to_string(path).unwrap_or_default())
        })
        .collect()
}

/// Whether a file holds tests only: an integration test or a unit-test module.
fn is_test_file(relative: &str) -> bool {
    relative.starts_with("tests/") || relative.ends_with("/tests.rs")
}

#[test]
fn every_source_file_starts_with_a_module_comment() {
    let missing: Vec<String> = workspace_files()
        .into_iter()
        .filter(|(_, text)| !text.starts_with("//!"))
        .map(|(relative, _)| relative)
        .collect();
    assert!(
        missing.is_empty(),
        "files without a leading //! comment: {missing:?}"
    );
}

#[test]
fn no_source_file_outside_tests_is_longer_than_the_limit() {
    let long: Vec<String> = workspace_files()
        .into_iter()
        .filter(|(relative, text)| {
            !is_test_file(relative) && text.lines().count() > MAX_SOURCE_LINES
        })
        .map(|(relative, text)| format!("{relative} ({} lines)", text.lines().count()))
        .collect();
    assert!(
        long.is_empty(),
        "split these along their seams (at most {MAX_SOURCE_LINES} lines): {long:?}"
    );
}

#[test]
fn unit_tests_follow_one_layout() {
    let strays: Vec<String> = workspace_files()
        .into_iter()
        .filter(|(relative, text)| {
            let named_aside = relative.ends_with("_tests.rs") && !relative.starts_with("tests/");
            // Examples may share a module by path; a test module may not.
            let test_by_path = text.lines().any(|line| {
                let line = line.trim_start();
                line.starts_with("#[path") && line.contains("test")
            });
            named_aside || test_by_path
        })
        .map(|(relative, _)| relative)
        .collect();
    assert!(
        strays.is_empty(),
        "unit tests go inline or in the module folder's tests.rs, without #[path]: {strays:?}"
    );
}
