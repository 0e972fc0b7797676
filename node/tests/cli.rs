//! The `xp-node` binary refuses bad start-up input with a message that names the problem.
//!
//! Having an integration test here also makes `cargo test --workspace` build the
//! `xp-node` binary that the root package's end-to-end tests start.

use std::process::Command;

fn xp_node() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xp-node"))
}

#[test]
fn a_garbage_join_string_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = xp_node()
        .args(["join", "--data-dir"])
        .arg(dir.path())
        .env("XP_JOIN", "http://nowhere")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("join string is invalid"),
        "stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
}

#[test]
fn a_bad_memory_size_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = xp_node()
        .args(["join", "--memory", "lots"])
        .arg("--data-dir")
        .arg(dir.path())
        .env("XP_JOIN", "xp://127.0.0.1:1?token=00&ca=00")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--memory"), "stderr: {stderr}");
}

#[test]
fn a_join_string_given_as_an_argument_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = xp_node()
        .args(["join", "xp://127.0.0.1:1?token=s3cret&ca=00", "--data-dir"])
        .arg(dir.path())
        .env_remove("XP_JOIN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("refusing a join string given as an argument"),
        "stderr: {stderr}"
    );
    assert!(stderr.contains("--join-file"), "stderr: {stderr}");
    assert!(stderr.contains("XP_JOIN"), "stderr: {stderr}");
}

#[test]
fn no_join_string_says_how_to_give_one() {
    let dir = tempfile::tempdir().unwrap();
    let out = xp_node()
        .args(["join", "--data-dir"])
        .arg(dir.path())
        .env_remove("XP_JOIN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no join string"), "stderr: {stderr}");
}
