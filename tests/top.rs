//! End-to-end: `xp top` in a real terminal, a detached tmux session of fixed
//! size. It shows the node and a running trial with its metric, opens the
//! trial's log tail on Enter and goes back on Esc, and on `q` exits 0 with the
//! terminal restored (the alternate screen left, the cursor shown, cooked mode
//! back). Skipped, with the reason printed, where tmux is absent.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::{TestCluster, trials, wait_until};

/// A trial that reports a metric, prints a line and then runs until the
/// cluster is torn down.
const SPEC: &str = "name: top-demo\ntrial:\n  command: [sh, -c, 'echo \"XP_METRIC {\\\"step\\\": 3, \\\"loss\\\": 0.25}\"; echo hello-from-the-trial; sleep 300']\n  resources: {gpu: 1, cpu: 0.5}\n";

/// A tmux server of its own (its socket in a temporary directory), killed on drop.
struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    fn command(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux runs")
    }

    fn must(&self, args: &[&str]) -> String {
        let output = self.command(args);
        assert!(
            output.status.success(),
            "tmux {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// What the pane shows now.
    fn capture(&self) -> String {
        self.must(&["capture-pane", "-p", "-t", "top"])
    }

    /// Waits until the pane shows every one of `texts`, and returns it.
    fn wait_for(&self, what: &str, texts: &[&str]) -> String {
        let mut last = String::new();
        let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_until(what, Duration::from_secs(90), || {
                last = self.capture();
                texts.iter().all(|text| last.contains(text)).then_some(())
            });
        }));
        if let Err(panic) = found {
            #[expect(clippy::print_stderr, reason = "show the pane of a failing test")]
            {
                eprintln!("==== the pane ====\n{last}");
            }
            std::panic::resume_unwind(panic);
        }
        last
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.command(&["kill-server"]);
    }
}

fn tmux_available() -> bool {
    Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|output| output.status.success())
}

/// The shell command the pane runs: `xp top`, then what the terminal looks like
/// after it, then a wait so the pane stays to be read.
fn pane_command(xp: &Path) -> String {
    format!(
        "'{}' top; echo \"top exited with $?\"; \
         if stty -a | grep -q -- ' -icanon'; then echo \"terminal: raw\"; else echo \"terminal: cooked\"; fi; \
         sleep 600",
        xp.display()
    )
}

#[test]
fn top_shows_the_cluster_and_restores_the_terminal() {
    if !tmux_available() {
        common::cannot_run("tmux is not installed (apt-get install tmux)");
        return;
    }
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 2, 2);
    cluster.wait_for_nodes(1);
    let node_id = cluster.node_id("a");
    let trial = must_run_reporting_trial(&cluster);
    let tmux = must_start_top_in_tmux(&cluster);
    check_top_shows_the_trial_and_its_log(&tmux, &node_id, &trial);
    // `q` quits and leaves the terminal as it was.
    tmux.must(&["send-keys", "-t", "top", "q"]);
    let pane = tmux.wait_for("xp top to exit", &["top exited with", "terminal: "]);
    assert!(pane.contains("top exited with 0"), "{pane}");
    assert!(
        pane.contains("terminal: cooked"),
        "raw mode left on:\n{pane}"
    );
    assert!(
        !pane.contains("Nodes (1)"),
        "the view is still on screen:\n{pane}"
    );
    let flags = tmux.must(&[
        "display-message",
        "-p",
        "-t",
        "top",
        "#{alternate_on} #{cursor_flag}",
    ]);
    assert_eq!(flags.trim(), "0 1", "alternate screen and cursor flags");
}

/// Submits the trial and waits until it runs and has reported its loss; the trial.
fn must_run_reporting_trial(cluster: &TestCluster) -> String {
    let spec = cluster.write_file("top.yaml", SPEC);
    let experiment = cluster
        .must_xp(&["submit", spec.to_str().expect("a UTF-8 path")])
        .trim()
        .to_owned();
    wait_until("the trial to run", Duration::from_secs(60), || {
        let status = cluster.status(&experiment);
        let trial = trials(&status).first()?.clone();
        let reported = trial["metrics"]["loss"].as_f64().is_some();
        (trial["state"] == "running" && reported)
            .then(|| trial["id"].as_str().expect("an id").to_owned())
    })
}

/// Starts `xp top` in a detached tmux session of 160 x 48.
fn must_start_top_in_tmux(cluster: &TestCluster) -> Tmux {
    let tmux = Tmux {
        socket: cluster.dir.path().join("tmux.sock"),
    };
    let command = pane_command(Path::new(env!("CARGO_BIN_EXE_xp")));
    // The server inherits XP_CLUSTER; `-e` puts it in the session too.
    let output = Command::new("tmux")
        .arg("-S")
        .arg(&tmux.socket)
        .args(["new-session", "-d", "-s", "top", "-x", "160", "-y", "48"])
        .args(["-e", &format!("XP_CLUSTER={}", cluster.join)])
        .arg(&command)
        .env("XP_CLUSTER", &cluster.join)
        .env("TERM", "xterm-256color")
        .output()
        .expect("tmux starts");
    assert!(
        output.status.success(),
        "tmux new-session failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    tmux
}

/// The node (by the id prefix in the trial's row), the trial and its metric
/// on the alternate screen; Enter opens the selected (only) trial's log tail,
/// Esc goes back.
fn check_top_shows_the_trial_and_its_log(tmux: &Tmux, node_id: &str, trial: &str) {
    let pane = tmux.wait_for(
        "xp top to show the node and the running trial",
        &["Nodes (1)", &node_id[..8], trial, "running", "loss=0.2500"],
    );
    assert!(pane.contains("Queues"), "{pane}");
    assert_eq!(
        tmux.must(&["display-message", "-p", "-t", "top", "#{alternate_on}"])
            .trim(),
        "1"
    );

    // Enter opens the selected (only) trial's log tail; Esc goes back.
    tmux.must(&["send-keys", "-t", "top", "Enter"]);
    tmux.wait_for("the log tail", &["Log of", "hello-from-the-trial"]);
    tmux.must(&["send-keys", "-t", "top", "Escape"]);
    tmux.wait_for("the tables again", &["Nodes (1)", "loss=0.2500"]);
}
