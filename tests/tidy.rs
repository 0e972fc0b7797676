//! Tidy checks over the source tree: every Rust file opens with a `//!` module
//! comment saying what it is for; no function is longer than a reader holds
//! in mind (a dispatch `match` whose arms are one call each aside); no source
//! file outside tests grows past 1,000 lines; unit tests follow one layout (an
//! inline `mod tests`, or a `tests.rs` in the module's folder; never a test
//! module by `#[path]`); no two top-level modules of a crate import each
//! other, directly or round a cycle; and the pure cores (the head's, the
//! policy, the tuning maths) link nothing that does I/O.

mod source_map;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The source folders of every package in the workspace.
const SOURCE_DIRS: [&str; 12] = [
    "src",
    "python/src",
    "runtime/src",
    "sched/src",
    "tune/src",
    "head-core/src",
    "head/src",
    "node/src",
    "sdk/src",
    "examples",
    "tests",
    "benches",
];

/// The source roots of the workspace's crates, whose top-level modules may
/// not import each other in a cycle.
const CRATE_ROOTS: [&str; 9] = [
    "src",
    "python/src",
    "runtime/src",
    "sched/src",
    "tune/src",
    "head-core/src",
    "head/src",
    "node/src",
    "sdk/src",
];

/// The longest a source file other than tests may be.
const MAX_SOURCE_LINES: usize = 1000;

/// The longest a function may be, from `fn` to its closing brace.
const MAX_FUNCTION_LINES: usize = 80;

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

#[test]
fn no_function_is_longer_than_a_reader_holds_in_mind() {
    let mut long = Vec::new();
    for (relative, text) in workspace_files() {
        for function in source_map::functions(&source_map::code_only(&text)) {
            if function.lines > MAX_FUNCTION_LINES && !source_map::is_dispatch_match(&function.body)
            {
                long.push(format!(
                    "{relative}:{} {} ({} lines)",
                    function.line, function.name, function.lines
                ));
            }
        }
    }
    assert!(
        long.is_empty(),
        "split these into named steps (at most {MAX_FUNCTION_LINES} lines, or one match whose arms are one call each): {long:#?}"
    );
}

#[test]
fn no_two_top_modules_of_a_crate_import_each_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut loops = Vec::new();
    for crate_root in CRATE_ROOTS {
        let src = root.join(crate_root);
        let modules = source_map::top_modules(&src);
        assert!(!modules.is_empty(), "no modules found in {crate_root}");
        let tops: BTreeSet<String> = modules.keys().cloned().collect();
        let lib = ["lib.rs", "main.rs"]
            .iter()
            .filter_map(|name| std::fs::read_to_string(src.join(name)).ok())
            .collect::<String>();
        let exports = source_map::root_exports(&lib, &tops);
        let edges: BTreeMap<String, BTreeSet<String>> = modules
            .iter()
            .map(|(module, files)| {
                let imports = files
                    .iter()
                    .flat_map(|(relative, text)| {
                        source_map::references(module, relative, text, &tops, &exports)
                    })
                    .collect();
                (module.clone(), imports)
            })
            .collect();
        loops.extend(
            source_map::cycles(&edges)
                .into_iter()
                .map(|cycle| format!("{crate_root}: {}", cycle.join(", "))),
        );
    }
    assert!(
        loops.is_empty(),
        "these top-level modules import each other round a cycle; move what they share to the module that owns it: {loops:#?}"
    );
}

/// The crates that must stay pure: their normal dependencies, as `cargo
/// tree` resolves them for each alone, include nothing that does I/O.
const PURE_CRATES: [&str; 3] = ["xp-head-core", "xp-sched", "xp-tune"];

#[test]
fn the_pure_cores_link_nothing_that_does_io() {
    for package in PURE_CRATES {
        let tree = std::process::Command::new(env!("CARGO"))
            .args([
                "tree",
                "-p",
                package,
                "-e",
                "normal",
                "--prefix",
                "none",
                "--offline",
                "--locked",
            ])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("cargo runs");
        assert!(
            tree.status.success(),
            "cargo tree failed: {}",
            String::from_utf8_lossy(&tree.stderr)
        );
        let linked: BTreeSet<String> = String::from_utf8_lossy(&tree.stdout)
            .lines()
            .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
            .collect();
        assert!(linked.contains(package), "{linked:?}");
        let impure: Vec<&str> = ["tokio", "ractor", "redb", "axum", "quinn", "reqwest", "mio"]
            .into_iter()
            .filter(|name| linked.contains(*name))
            .collect();
        assert!(
            impure.is_empty(),
            "{package} links {impure:?}: a core takes time as an argument and does no I/O"
        );
    }
}

/// The checks themselves: what the scanner sees of a small piece of code.
#[test]
fn the_scanner_sees_functions_dispatches_and_cycles() {
    let code = source_map::code_only(
        "fn a() {\n    let s = \"}\"; // }\n    let c = '}';\n}\nfn b(x: u8) -> u8 { match x { 0 => one(), _ => { two(); } } }\n",
    );
    let functions = source_map::functions(&code);
    let names: Vec<(&str, usize, usize)> = functions
        .iter()
        .map(|function| (function.name.as_str(), function.line, function.lines))
        .collect();
    assert_eq!(names, [("a", 1, 4), ("b", 5, 1)]);
    assert!(!source_map::is_dispatch_match(&functions[0].body));
    assert!(source_map::is_dispatch_match(&functions[1].body));
    assert!(!source_map::is_dispatch_match(
        " match x { 0 => { one(); two(); } _ => three() } "
    ));
    assert!(!source_map::is_dispatch_match(
        " step(); match x { _ => one() } "
    ));
    let edges: BTreeMap<String, BTreeSet<String>> = [
        ("actor", vec!["core"]),
        ("server", vec!["actor"]),
        ("core", vec!["server"]),
        ("leaf", vec![]),
    ]
    .into_iter()
    .map(|(module, imports)| {
        (
            module.to_owned(),
            imports.into_iter().map(str::to_owned).collect(),
        )
    })
    .collect();
    assert_eq!(source_map::cycles(&edges), [["actor", "core", "server"]]);
    let tops: BTreeSet<String> = ["actor", "core"].map(str::to_owned).into();
    let exports = source_map::root_exports("pub use self::core::{HeadCore, Record};", &tops);
    let named = source_map::references(
        "actor",
        "actor/mod.rs",
        "use crate::HeadCore;\nuse super::core::x; // crate::server\n#[cfg(test)]\nmod tests {\n    use crate::actor;\n}\n",
        &tops,
        &exports,
    );
    assert_eq!(named, BTreeSet::from(["core".to_owned()]));
}
