//! The `xp-head` binary refuses bad start-up input with a message that names the problem.
//!
//! Having an integration test here also makes `cargo test --workspace` build the
//! `xp-head` binary that the root package's end-to-end tests start.

use std::process::Command;

fn xp_head() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xp-head"))
}

#[test]
fn a_bad_listen_address_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = xp_head()
        .args(["start", "--listen", "not-an-address", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--listen"), "stderr: {stderr}");
}

#[test]
fn a_data_dir_that_is_a_file_is_refused_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let out = xp_head()
        .args(["start", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot start the head") && stderr.contains("not-a-dir"),
        "stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
}
