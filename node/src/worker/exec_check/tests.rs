//! The launch check against real files: each failure told apart and named,
//! as the node's own user and, as root, as a worker's user id.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::*;
use crate::isolation::as_worker::AsWorker;
use crate::isolation::fs::FileOwner;
use xp_runtime::error_chain::error_chain;

/// Outside the default range, so no node on this machine hands it out.
const UID: u32 = 1_899_000_612;

/// A directory others may enter, with files of chosen modes.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        chmod(dir.path(), 0o755);
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn file(&self, name: &str, text: &str, mode: u32) -> PathBuf {
        let path = self.path(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("parent");
        }
        std::fs::write(&path, text).expect("file");
        chmod(&path, mode);
        path
    }

    fn around(&self, path: &str, runner: Runner) -> Surroundings {
        Surroundings {
            cwd: self.dir.path().to_owned(),
            path: Some(
                path.replace("DIR", &self.dir.path().display().to_string())
                    .into(),
            ),
            runner,
            absent: Default::default(),
        }
    }
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Runs the check as the node's user, expecting `Ok(path)` or an error whose
/// message holds every fragment.
fn check_as_node(files: &Files, program: &str, path_var: &str, expected: Result<&str, &[&str]>) {
    let around = files.around(path_var, Runner::Node);
    let program_path = program.replace("DIR", &files.dir.path().display().to_string());
    let result = check(Path::new(&program_path), &[], &around);
    compare(program, result, files, expected);
}

fn compare(
    program: &str,
    result: Result<PathBuf, ProgramError>,
    files: &Files,
    expected: Result<&str, &[&str]>,
) {
    match (result, expected) {
        (Ok(found), Ok(name)) => assert_eq!(found, files.path(name), "{program}"),
        (Err(error), Err(fragments)) => {
            let message = error_chain(&error);
            for fragment in fragments {
                let fragment = fragment.replace("DIR", &files.dir.path().display().to_string());
                assert!(
                    message.contains(&fragment),
                    "{program}: {fragment:?} not in {message:?}"
                );
            }
        }
        (result, expected) => panic!("{program}: got {result:?}, expected {expected:?}"),
    }
}

#[test]
fn each_failure_is_told_apart_and_names_its_path() {
    let files = Files::new();
    files.file("bin/tool", "#!/bin/sh\necho\n", 0o755);
    files.file("plain.txt", "text\n", 0o644);
    files.file("lost.sh", "#!/no/such/interpreter -x\n", 0o755);
    files.file(
        "envy.sh",
        "#!/usr/bin/env -S no-such-program-xp --flag\n",
        0o755,
    );
    files.file("run.sh", "#!/bin/sh\n", 0o755);
    std::fs::create_dir(files.path("adir")).expect("dir");
    check_as_node(&files, "tool", "DIR/nowhere:DIR/bin", Ok("bin/tool"));
    check_as_node(&files, "./run.sh", "", Ok("./run.sh"));
    check_as_node(
        &files,
        "no-such-program-xp",
        "DIR/bin",
        Err(&["not found: no directory of the worker's PATH (DIR/bin) holds `no-such-program-xp`"]),
    );
    check_as_node(
        &files,
        "/no/such/program",
        "",
        Err(&["not found: /no/such/program does not exist"]),
    );
    check_as_node(
        &files,
        "DIR/plain.txt",
        "",
        Err(&["not executable: DIR/plain.txt: it has no execute permission"]),
    );
    check_as_node(
        &files,
        "DIR/adir",
        "",
        Err(&["not executable: DIR/adir: it is a directory"]),
    );
    check_as_node(
        &files,
        "DIR/lost.sh",
        "",
        Err(&[
            "the interpreter on the #! line of DIR/lost.sh cannot run: not found: /no/such/interpreter does not exist",
        ]),
    );
    check_as_node(
        &files,
        "DIR/envy.sh",
        "DIR/bin",
        Err(&[
            "of DIR/envy.sh cannot run: not found: no directory of the worker's PATH (DIR/bin) holds `no-such-program-xp`",
        ]),
    );
}

/// Runs the check as the worker `worker` (through [`check_as`], as the node
/// does), expecting `Ok(path)` or an error whose message holds every fragment.
fn check_as_worker(
    files: &Files,
    worker: &AsWorker,
    (program, path_var): (&str, &str),
    read: &[&str],
    expected: Result<&str, &[&str]>,
) {
    let around = files.around(path_var, Runner::OwnUid(UID));
    let program_path = program.replace("DIR", &files.dir.path().display().to_string());
    let read: Vec<PathBuf> = read.iter().map(|name| files.path(name)).collect();
    let result = check_as(worker, Path::new(&program_path), &read, around).expect("ran");
    compare(program, result, files, expected);
}

/// As root: a worker's id is refused what it may not reach or run, with what
/// to do, is found what it may run further along its `PATH`, and is told a
/// program is not found when it is on no directory of its `PATH`, though it
/// may not search one of them.
#[test]
#[expect(clippy::print_stderr, reason = "say why the test is skipped")]
fn a_workers_uid_is_refused_what_it_may_not_run_and_told_what_to_do() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: only root can take on another user id");
        return;
    }
    let files = Files::new();
    // Like pyenv under /root: a directory the worker may not enter.
    files.file("private/bin/python", "#!/bin/sh\n", 0o755);
    chmod(&files.path("private"), 0o700);
    files.file("public/bin/python", "#!/bin/sh\n", 0o755);
    files.file("group-only", "#!/bin/sh\n", 0o750);
    let shebang = format!("#!{}\n", files.path("private/bin/python").display());
    files.file("script.sh", &shebang, 0o755);
    files.file("secret.py", "print()\n", 0o600);
    files.file("open.py", "print()\n", 0o644);
    let worker = AsWorker::start(Some(FileOwner::of_uid(UID))).expect("the worker's thread");
    let check = |program_and_path, read: &[&str], expected| {
        check_as_worker(&files, &worker, program_and_path, read, expected);
    };
    let both = "DIR/private/bin:DIR/public/bin";
    check(("python", both), &[], Ok("public/bin/python"));
    check(
        ("python", "DIR/private/bin"),
        &[],
        Err(&[
            "permission denied: the worker's user id 1899000612 may not run DIR/private/bin/python: DIR/private does not let it through (mode 0700, owner 0:0); make it readable and executable by other users",
            "or run the node with --worker-uids none",
        ]),
    );
    check(
        ("no-such-program-xp", both),
        &[],
        Err(&["not found: no directory of the worker's PATH"]),
    );
    check(
        ("DIR/group-only", ""),
        &[],
        Err(&["may not run DIR/group-only: its mode is 0750, owner 0:0"]),
    );
    check(
        ("DIR/script.sh", ""),
        &[],
        Err(&[
            "the interpreter on the #! line of DIR/script.sh cannot run: permission denied",
            "DIR/private does not let it through",
        ]),
    );
    check(
        ("python", both),
        &["secret.py"],
        Err(&[
            "may not read DIR/secret.py: its mode is 0600, owner 0:0; make it readable by other users",
        ]),
    );
    check(("python", both), &["open.py"], Ok("public/bin/python"));
    // The node's own user (root) may run what the worker's may not.
    let around = files.around("DIR/private/bin", Runner::Node);
    compare(
        "python",
        super::check(Path::new("python"), &[], &around),
        &files,
        Ok("private/bin/python"),
    );
}
