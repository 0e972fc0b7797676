//! Docs that cannot lie: the code blocks of README.md and docs/ marked as
//! tested run here, against the real binaries.
//!
//! A fence's info string marks a block: ```` ```sh tested ```` runs the block
//! with bash (`-euo pipefail`), ```` ```yaml tested file=NAME ```` (or any
//! other language with `file=`) writes the block to `NAME` for the blocks
//! after it, and `cluster` on a `sh` block runs it with `XP_CLUSTER` set to
//! the admin of a real head and node started for the document (without it,
//! `xp run` starts its own embedded cluster). `postgres` on a block puts the
//! document's head on a PostgreSQL server of its own, whose address the
//! `sh` blocks find in `XP_STORE`, and gives its node two GPUs. Each
//! document's marked blocks run in order, as one script, in a fresh
//! directory where `examples/` and `data/` are the repository's, with the
//! workspace's `xp` binaries first on the `PATH`. Python blocks marked
//! ```` ```python tested ```` run in the Python package's suite
//! (python/tests/test_doc_blocks.py), which has the package installed.
//!
//! Also: every experiment file in the docs (a YAML block with `trial:` and
//! `search:` at its top) is read and validated by the real parser, marked or
//! not.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{TestCluster, bin_dir};

/// The repository.
const REPO: &str = env!("CARGO_MANIFEST_DIR");
/// The fewest tested blocks the docs hold: removing marks must fail here.
const MIN_TESTED_BLOCKS: usize = 3;

/// One fenced block of a document.
#[derive(Debug)]
struct Block {
    /// The document and the line its fence opens on.
    place: String,
    /// The language: `sh`, `yaml`, `python`, ...
    language: String,
    /// The other words of the info string.
    words: Vec<String>,
    text: String,
}

impl Block {
    fn is_tested(&self) -> bool {
        self.words.iter().any(|word| word == "tested")
    }

    fn wants_cluster(&self) -> bool {
        self.words.iter().any(|word| word == "cluster")
    }

    fn wants_postgres(&self) -> bool {
        self.words.iter().any(|word| word == "postgres")
    }

    fn file_name(&self) -> Option<&str> {
        self.words
            .iter()
            .find_map(|word| word.strip_prefix("file="))
    }
}

/// The fenced blocks of `path`, in order.
fn blocks_of(path: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(path).expect("a readable document");
    let shown = path
        .strip_prefix(REPO)
        .unwrap_or(path)
        .display()
        .to_string();
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (number, line) in text.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (None, Some(info)) => {
                let mut words = info.split_whitespace().map(str::to_owned);
                open = Some(Block {
                    place: format!("{shown}:{}", number + 1),
                    language: words.next().unwrap_or_default(),
                    words: words.collect(),
                    text: String::new(),
                });
            }
            (Some(_), Some(_)) => blocks.extend(open.take()),
            (Some(block), None) => {
                block.text.push_str(line);
                block.text.push('\n');
            }
            (None, None) => {}
        }
    }
    blocks
}

/// README.md and every Markdown file under docs/.
fn documents() -> Vec<PathBuf> {
    let mut found = vec![Path::new(REPO).join("README.md")];
    let mut dirs = vec![Path::new(REPO).join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("docs/ is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The script that runs a document's tested blocks in order.
fn script_of(blocks: &[&Block], cluster: Option<&TestCluster>) -> String {
    let mut script = String::new();
    for block in blocks {
        script.push_str(&format!("echo '--- {}' >&2\n", block.place));
        match (block.language.as_str(), block.file_name()) {
            (_, Some(name)) => {
                script.push_str(&format!(
                    "cat > '{name}' <<'XP_DOC_BLOCK'\n{}XP_DOC_BLOCK\n",
                    block.text
                ));
            }
            ("sh", _) => {
                let credential = cluster.filter(|_| block.wants_cluster());
                if let Some(cluster) = credential {
                    script.push_str(&format!("export XP_CLUSTER='{}'\n", cluster.join));
                    if let Some(store) = cluster.store_url() {
                        script.push_str(&format!("export XP_STORE='{store}'\n"));
                    }
                }
                script.push_str(&block.text);
                if credential.is_some() {
                    script.push_str("unset XP_CLUSTER\n");
                }
            }
            _ => panic!("{}: a tested block is `sh` or has `file=NAME`", block.place),
        }
    }
    script
}

/// Runs the tested blocks of `document`; their number.
fn run_document(document: &Path) -> usize {
    let blocks = blocks_of(document);
    let tested: Vec<&Block> = blocks
        .iter()
        .filter(|block| block.is_tested() && block.language != "python")
        .collect();
    if tested.is_empty() {
        return 0;
    }
    let on_postgres = tested.iter().any(|block| block.wants_postgres());
    let cluster = if tested.iter().any(|block| block.wants_cluster()) {
        let started = if on_postgres {
            TestCluster::start_on_postgres("10s", &[])
        } else {
            Some(TestCluster::start("10s"))
        };
        // Without PostgreSQL (and outside CI) the document cannot run here.
        let Some(mut cluster) = started else {
            return 0;
        };
        cluster.start_node("n1", if on_postgres { 2 } else { 0 }, 4);
        cluster.wait_for_nodes(1);
        Some(cluster)
    } else {
        None
    };
    let dir = tempfile::tempdir().expect("a directory for the document");
    for shared in ["examples", "data"] {
        std::os::unix::fs::symlink(Path::new(REPO).join(shared), dir.path().join(shared))
            .expect("link the repository's files");
    }
    let path = format!(
        "{}:{}",
        bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let output = Command::new("bash")
        .args([
            "-euo",
            "pipefail",
            "-c",
            &script_of(&tested, cluster.as_ref()),
        ])
        .current_dir(dir.path())
        .env("PATH", path)
        .env_remove("XP_CLUSTER")
        .output()
        .expect("bash runs");
    assert!(
        output.status.success(),
        "the tested blocks of {} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        document.display(),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    tested.len()
}

#[test]
fn the_docs_tested_blocks_run() {
    let ran: usize = documents()
        .iter()
        .map(|document| run_document(document))
        .sum();
    assert!(
        ran >= MIN_TESTED_BLOCKS,
        "only {ran} tested blocks in the docs: a `tested` mark went missing"
    );
}

#[test]
fn every_experiment_file_in_the_docs_is_valid() {
    let mut checked = 0;
    for document in documents() {
        for block in blocks_of(&document) {
            let top_level = |key: &str| block.text.lines().any(|line| line.starts_with(key));
            if block.language != "yaml" || !top_level("trial:") || !top_level("search:") {
                continue;
            }
            if let Err(error) = xp::ExperimentSpec::from_yaml(&block.text) {
                panic!(
                    "{}: not a valid experiment: {error}\n{}",
                    block.place, block.text
                );
            }
            checked += 1;
        }
    }
    assert!(
        checked >= 2,
        "only {checked} experiment files found in the docs"
    );
}
