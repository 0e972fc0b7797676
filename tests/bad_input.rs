//! Bad input gets a clear error and the cluster keeps working: wrong token, wrong
//! CA hash, random datagrams, oversized, foreign and garbage frames, malformed
//! YAML, unknown fields, sizes and priorities that mean nothing, and workers no
//! node could ever hold.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{TestCluster, binary};
use xp_runtime::frame;
use xp_runtime::join::JoinString;
use xp_runtime::protocol::{ErrorCode, Message, PROTOCOL_VERSION, PeerRole};

/// A small deterministic generator, so failures replay.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn stderr_of(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn with_query(join: &str, key: &str, value: &str) -> String {
    let mut parsed: JoinString = join.parse().unwrap();
    match key {
        "token" => parsed.token = value.to_owned(),
        "ca" => hex_decode(value, &mut parsed.ca_sha256),
        _ => unreachable!(),
    }
    parsed.to_string()
}

fn hex_decode(text: &str, out: &mut [u8; 32]) {
    for (idx, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[idx * 2..idx * 2 + 2], 16).unwrap();
    }
}

/// Sends `bytes` raw on a fresh stream of an authenticated connection and returns the head's answer.
async fn answer_to_raw_bytes(join: &JoinString, bytes: &[u8]) -> Message {
    let (connection, _send, _recv) =
        xp_runtime::transport::connect(join, PeerRole::Client, "bad-input-test")
            .await
            .unwrap();
    let (mut send, mut recv) = connection.connection.open_bi().await.unwrap();
    send.write_all(bytes).await.unwrap();
    let _ = send.finish();
    let answer = tokio::time::timeout(Duration::from_secs(10), frame::read_message(&mut recv))
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    connection.close().await;
    answer
}

fn check_refused_with(answer: Message, code: ErrorCode) {
    match answer {
        Message::Error(error) => assert_eq!(error.code, code, "{error:?}"),
        other => panic!("expected an error {code:?}, got {other:?}"),
    }
}

#[test]
fn bad_input_is_refused_clearly_and_the_cluster_keeps_working() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 2);
    cluster.wait_for_nodes(1);
    // A wrong token and a wrong CA hash are named as such, and the process exits non-zero.
    check_wrong_credentials_named(&cluster);
    // Random datagrams on the QUIC port.
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for seed in 0..300u64 {
        let _ = socket.send_to(
            &noise(seed, (seed as usize * 37) % 1400 + 1),
            ("127.0.0.1", cluster.port),
        );
    }

    // Oversized, foreign-version and garbage frames on an authenticated stream.
    let join: JoinString = cluster.join.parse().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(check_bad_frames_refused(&join));
    runtime.block_on(check_garbage_hello_closes(&join));
    // Malformed YAML and unknown fields name the place.
    check_bad_specs_name_the_place(&cluster);
    // After all that, the cluster still runs work.
    let good = cluster.write_file(
        "good.yaml",
        "name: still-fine\ntrial:\n  command: [sh, -c, 'echo \"XP_METRIC {\\\"ok\\\": 1}\"']\n",
    );
    let experiment = cluster
        .must_xp(&["submit", good.to_str().unwrap()])
        .trim()
        .to_owned();
    let status = cluster.wait_finished(&experiment, Duration::from_secs(60));
    assert_eq!(status["state"], "succeeded", "{status:#}");
    assert_eq!(status["trials"][0]["metrics"]["ok"], 1.0);
}

/// A wrong token, a wrong CA hash and a string that is no join string are
/// each named, for `xp` and `xp-node`, which exit non-zero.
fn check_wrong_credentials_named(cluster: &TestCluster) {
    let wrong_token = with_query(&cluster.join, "token", &"00".repeat(32));
    let output = Command::new(env!("CARGO_BIN_EXE_xp"))
        .args(["nodes", "--cluster", &wrong_token])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        stderr_of(&output).contains("wrong token"),
        "{}",
        stderr_of(&output)
    );
    let wrong_ca = with_query(&cluster.join, "ca", &"ab".repeat(32));
    let output = Command::new(env!("CARGO_BIN_EXE_xp"))
        .args(["nodes", "--cluster", &wrong_ca])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        stderr_of(&output).contains("CA does not match"),
        "{}",
        stderr_of(&output)
    );
    let output = Command::new(binary("xp-node"))
        .args(["join", "--data-dir"])
        .arg(cluster.dir.path().join("refused-node"))
        .env("XP_JOIN", &wrong_token)
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        stderr_of(&output).contains("wrong token"),
        "{}",
        stderr_of(&output)
    );
    let output = Command::new(env!("CARGO_BIN_EXE_xp"))
        .args(["nodes", "--cluster", "xp://nowhere"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        stderr_of(&output).contains("join string"),
        "{}",
        stderr_of(&output)
    );
}

/// Oversized, foreign-version and garbage frames on an authenticated stream
/// are each refused with their error code.
async fn check_bad_frames_refused(join: &JoinString) {
    let mut oversized = ((frame::MAX_FRAME_BYTES + 1) as u32).to_be_bytes().to_vec();
    oversized.extend_from_slice(&noise(1, 64));
    check_refused_with(
        answer_to_raw_bytes(join, &oversized).await,
        ErrorCode::FrameTooLarge,
    );

    let mut foreign =
        frame::encode(&Message::Request(xp_runtime::protocol::Request::Nodes)).unwrap();
    foreign[4..6].copy_from_slice(&(PROTOCOL_VERSION + 1).to_be_bytes());
    check_refused_with(
        answer_to_raw_bytes(join, &foreign).await,
        ErrorCode::UnsupportedVersion,
    );

    let mut garbage = 66u32.to_be_bytes().to_vec();
    garbage.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
    garbage.extend_from_slice(&noise(2, 64));
    check_refused_with(
        answer_to_raw_bytes(join, &garbage).await,
        ErrorCode::MalformedFrame,
    );
}

/// Garbage instead of a hello: the connection is closed with a reason.
async fn check_garbage_hello_closes(join: &JoinString) {
    let (_endpoint, connection) = xp_runtime::transport::connect_unauthenticated(join)
        .await
        .unwrap();
    let (mut send, _recv) = connection.open_bi().await.unwrap();
    send.write_all(&noise(3, 200)).await.unwrap();
    let _ = send.finish();
    let closed = tokio::time::timeout(Duration::from_secs(15), connection.closed())
        .await
        .unwrap();
    assert!(
        matches!(closed, quinn::ConnectionError::ApplicationClosed(_)),
        "{closed:?}"
    );
}

/// Malformed YAML, unknown fields and bad values are refused, naming the place.
fn check_bad_specs_name_the_place(cluster: &TestCluster) {
    let broken = cluster.write_file("broken.yaml", "name: x\ntrial: [unclosed\n");
    let output = cluster.xp(&["submit", broken.to_str().unwrap()]);
    assert!(!output.status.success());
    assert!(
        stderr_of(&output).contains("line"),
        "{}",
        stderr_of(&output)
    );
    let unknown = cluster.write_file(
        "unknown.yaml",
        "name: x\ntrial:\n  command: [echo]\n  wrkers: 2\n",
    );
    let output = cluster.xp(&["submit", unknown.to_str().unwrap()]);
    assert!(!output.status.success());
    assert!(
        stderr_of(&output).contains("wrkers") && stderr_of(&output).contains("line 4"),
        "{}",
        stderr_of(&output)
    );
    let bad_value = cluster.write_file(
        "bad-value.yaml",
        "name: x\ntrial:\n  command: [echo]\n  workers: 0\n",
    );
    let output = cluster.xp(&["submit", bad_value.to_str().unwrap()]);
    assert!(
        stderr_of(&output).contains("trial.workers"),
        "{}",
        stderr_of(&output)
    );
}

#[test]
fn impossible_requests_and_nonsense_values_are_refused_at_submission() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 2);
    cluster.wait_for_nodes(1);
    // A worker no node could ever hold is refused at once, naming the largest node,
    // instead of waiting forever; nonsense sizes and priorities name the field.
    let too_big = cluster.write_file(
        "too-big.yaml",
        "name: x\ntrial:\n  command: [echo]\n  resources: {memory: 1EiB}\n",
    );
    let output = cluster.xp(&["submit", too_big.to_str().unwrap()]);
    assert!(!output.status.success());
    assert!(
        stderr_of(&output).contains("no node can hold one worker")
            && stderr_of(&output).contains("the largest nodes offer 0 GPU, 2 CPU"),
        "{}",
        stderr_of(&output)
    );
    for (name, text, field) in [
        (
            "negative-memory.yaml",
            "name: x\ntrial:\n  command: [echo]\n  resources: {memory: -1}\n",
            "memory",
        ),
        (
            "huge-priority.yaml",
            "name: x\npriority: 1e308\ntrial:\n  command: [echo]\n",
            "priority",
        ),
    ] {
        let file = cluster.write_file(name, text);
        let output = cluster.xp(&["submit", file.to_str().unwrap()]);
        let stderr = stderr_of(&output);
        assert!(
            stderr.contains(field)
                && stderr.contains("whole number")
                && !stderr.contains("untagged"),
            "{stderr}"
        );
    }
}

/// Runs `xp ARGS` with its stdout already closed by the reader, as in
/// `xp status | head -0`, and returns its exit status and stderr.
fn xp_into_closed_pipe(cluster: &TestCluster, args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_xp"))
        .args(args)
        .env("XP_CLUSTER", &cluster.join)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The reader goes away before the first byte is written.
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    (output.status, stderr_of(&output))
}

#[test]
fn commands_stop_quietly_when_their_reader_goes_away() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 2);
    cluster.wait_for_nodes(1);
    let spec = cluster.write_file(
        "piped.yaml",
        "name: piped\ntrial:\n  command: [sh, -c, 'seq 1 2000; echo \"XP_METRIC {\\\"ok\\\": 1}\"']\n",
    );
    let experiment = cluster
        .must_xp(&["submit", spec.to_str().unwrap()])
        .trim()
        .to_owned();
    let status = cluster.wait_finished(&experiment, Duration::from_secs(60));
    let trial = status["trials"][0]["id"].as_str().unwrap().to_owned();
    for args in [
        vec!["status"],
        vec!["status", "--json"],
        vec!["nodes"],
        vec!["queue"],
        vec!["logs", trial.as_str()],
        vec!["metrics", trial.as_str()],
        vec!["sim", "generate", "--jobs", "50", "--rate", "10"],
    ] {
        let (exit, stderr) = xp_into_closed_pipe(&cluster, &args);
        assert!(
            exit.success() && !stderr.contains("panicked"),
            "xp {args:?} into a closed pipe: {exit:?}\n{stderr}"
        );
    }
}

/// Runs `xp ARGS` (without a cluster) with its stderr a pipe whose reader is
/// already gone, and with `closed_stdout` its stdout too; its exit status.
fn xp_with_closed_stderr(args: &[&str], closed_stdout: bool) -> std::process::ExitStatus {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut command = Command::new(env!("CARGO_BIN_EXE_xp"));
    command
        .args(args)
        .env_remove("XP_CLUSTER")
        .env("XP_LOG", "debug")
        .stderr(writer);
    if closed_stdout {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        command.stdout(writer);
    } else {
        command.stdout(std::process::Stdio::null());
    }
    command.status().unwrap()
}

#[test]
fn commands_exit_with_their_own_status_when_stderr_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.csv");
    let trace = trace.to_str().unwrap();
    // (arguments, whether stdout is closed too, the exit status expected):
    // an error (no cluster named), a note on stderr, output and a note.
    for (args, closed_stdout, code) in [
        (vec!["status"], false, 1),
        (vec!["status"], true, 1),
        (vec!["logs", "not-a-trial"], false, 1),
        (
            vec![
                "sim", "generate", "--jobs", "5", "--rate", "1", "--out", trace,
            ],
            false,
            0,
        ),
        (
            vec!["sim", "generate", "--jobs", "50", "--rate", "10"],
            true,
            0,
        ),
    ] {
        let status = xp_with_closed_stderr(&args, closed_stdout);
        assert_eq!(
            status.code(),
            Some(code),
            "xp {args:?} with a closed stderr (stdout closed: {closed_stdout}): {status:?}"
        );
    }
}

/// A metric name a trial chose: terminal escapes (clear the screen, set the
/// window title, ring) and a newline that would forge a line of its own.
const HOSTILE_METRIC: &str = "\u{1b}[2J\u{1b}]0;pwned\u{7}m\nfake line";

/// What `xp ARGS` printed on stdout holds no control character but newlines,
/// shows the hostile name's escapes, and forges no line.
fn check_printed_escaped(cluster: &TestCluster, args: &[&str]) {
    let stdout = cluster.must_xp(args);
    assert!(
        !stdout.chars().any(|ch| ch.is_control() && ch != '\n'),
        "xp {args:?} printed a control character: {stdout:?}"
    );
    assert!(
        stdout.contains("\\u001b[2J\\u001b]0;pwned\\u0007m"),
        "xp {args:?}: {stdout:?}"
    );
    assert!(
        !stdout.lines().any(|line| line.starts_with("fake line")),
        "xp {args:?} printed a forged line: {stdout:?}"
    );
}

#[test]
fn user_text_reaches_the_terminal_escaped() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 2);
    cluster.wait_for_nodes(1);
    let metric_line = serde_json::json!({ HOSTILE_METRIC: 1.0 }).to_string();
    let script = cluster.write_file(
        "hostile.sh",
        &format!("printf '%s\\n' 'XP_METRIC {metric_line}'\n"),
    );
    let spec = cluster.write_file(
        "hostile.yaml",
        &format!(
            "name: hostile\ntrial: {{command: [sh, '{}']}}\n",
            script.display()
        ),
    );
    let experiment = cluster
        .must_xp(&["submit", spec.to_str().unwrap()])
        .trim()
        .to_owned();
    let status = cluster.wait_finished(&experiment, Duration::from_secs(60));
    // JSON keeps the name exactly as the trial wrote it.
    assert_eq!(
        status["trials"][0]["metrics"][HOSTILE_METRIC], 1.0,
        "{status:#}"
    );
    let trial = status["trials"][0]["id"].as_str().unwrap().to_owned();
    for args in [
        vec!["status"],
        vec!["status", experiment.as_str()],
        vec!["status", "--json"],
        vec!["metrics", trial.as_str()],
    ] {
        check_printed_escaped(&cluster, &args);
    }
}
