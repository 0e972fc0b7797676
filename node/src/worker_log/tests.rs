//! Tests of the capped log: the line splitter, the writer's layout and cap, the
//! reader's offsets while the writer writes, and a real worker process through
//! `worker::supervise`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use xp_runtime::ids::{ExperimentId, TrialId, WorkerKey};
use xp_runtime::protocol::WorkerReport;

use super::lines::{Line, LineSplitter};
use super::{
    LogCap, LogWriter, MIN_LOG_CAP, files_on_disk, list_segments, marker_line, marker_path, read,
};
use crate::objects::{ObjectStore, StoreLimits};
use crate::worker::supervise;

/// What the splitter yields for `chunks`: whole lines as text, overlong ones as
/// `TOO LONG <len> <start>`.
fn check_lines(max: usize, chunks: &[&str], expected: &[&str]) {
    let mut splitter = LineSplitter::new(max);
    let mut got = Vec::new();
    let describe = |line: Line<'_>| match line {
        Line::Whole(bytes) => String::from_utf8(bytes.to_vec()).unwrap(),
        Line::TooLong { start, len } => {
            format!("TOO LONG {len} {}", String::from_utf8_lossy(start))
        }
    };
    for chunk in chunks {
        let mut rest = chunk.as_bytes();
        while !rest.is_empty() {
            let (taken, line) = splitter.next(rest);
            assert!(taken > 0);
            rest = &rest[taken..];
            if let Some(line) = line {
                got.push(describe(line));
            }
        }
    }
    if let Some(line) = splitter.finish() {
        got.push(describe(line));
    }
    assert_eq!(got, expected, "chunks {chunks:?}");
}

#[test]
fn lines_are_split_across_chunks_and_bounded() {
    check_lines(8, &["a\nb\n"], &["a\n", "b\n"]);
    check_lines(8, &["ab", "c\nd"], &["abc\n", "d"]);
    check_lines(8, &["", "x\n", ""], &["x\n"]);
    check_lines(8, &["1234567\n"], &["1234567\n"]);
    check_lines(8, &["12345678\n", "ok\n"], &["TOO LONG 9 12345678", "ok\n"]);
    check_lines(
        4,
        &["ab", "cdef", "gh", "ij\nXP\n"],
        &["TOO LONG 11 abcd", "XP\n"],
    );
    check_lines(4, &["abcdefgh"], &["TOO LONG 8 abcd"]);
    check_lines(4, &["abc", "\n", "\n"], &["abc\n", "\n"]);
}

/// Hostile output (tests/hostile_bytes.rs covers the decoders behind the
/// splitter): arbitrary bytes in arbitrary chunks come out as exactly the input's
/// lines, none held past `max` bytes, each overlong one once with its true length.
#[test]
#[expect(clippy::print_stderr, reason = "say how many inputs ran")]
fn arbitrary_output_splits_into_its_lines_within_the_bound() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let scale: u32 = std::env::var("XP_FUZZ_SCALE")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(1);
    let cases = 3000 * scale;
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let inputs = (
        1usize..64,
        // Newlines often enough (one byte in eight) that short, long and
        // empty lines all occur.
        proptest::collection::vec(any::<u8>(), 0..512).prop_map(|mut bytes| {
            for byte in &mut bytes {
                if *byte % 8 == 0 {
                    *byte = b'\n';
                }
            }
            bytes
        }),
        proptest::collection::vec(1usize..96, 1..16),
    );
    runner
        .run(&inputs, |(max, output, cuts)| {
            let mut splitter = LineSplitter::new(max);
            let mut lines: Vec<(Vec<u8>, usize)> = Vec::new();
            let mut keep = |line: Line<'_>| match line {
                Line::Whole(bytes) => {
                    assert!(bytes.len() <= max, "a whole line over {max} bytes");
                    lines.push((bytes.to_vec(), bytes.len()));
                }
                Line::TooLong { start, len } => {
                    assert!(start.len() == max && len > max, "{} of {len}", start.len());
                    lines.push((start.to_vec(), len));
                }
            };
            let mut rest = &output[..];
            let mut cut = cuts.iter().cycle();
            while !rest.is_empty() {
                let mut chunk = &rest[..rest.len().min(*cut.next().expect("cycles"))];
                rest = &rest[chunk.len()..];
                while !chunk.is_empty() {
                    let (taken, line) = splitter.next(chunk);
                    prop_assert!(taken > 0);
                    chunk = &chunk[taken..];
                    if let Some(line) = line {
                        keep(line);
                    }
                }
            }
            if let Some(line) = splitter.finish() {
                keep(line);
            }
            let expected: Vec<(Vec<u8>, usize)> = output
                .split_inclusive(|byte| *byte == b'\n')
                .map(|line| (line[..line.len().min(max)].to_vec(), line.len()))
                .collect();
            prop_assert_eq!(lines, expected);
            Ok(())
        })
        .unwrap();
    eprintln!("hostile worker output (LineSplitter): {cases} inputs");
}

/// Deterministic output: numbered lines of varying length.
fn stream(len: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(len + 64);
    let mut line_idx = 0;
    while bytes.len() < len {
        bytes.extend_from_slice(
            format!("line {line_idx} {}\n", "=".repeat(line_idx % 37)).as_bytes(),
        );
        line_idx += 1;
    }
    bytes.truncate(len);
    bytes
}

fn log_in(dir: &Path) -> PathBuf {
    dir.join("logs").join("rank0.log")
}

/// Everything a reader gets from offset 0 until it is caught up.
fn read_all(path: &Path, max_bytes: u32) -> Vec<u8> {
    let mut offset = 0;
    let mut all = Vec::new();
    loop {
        let piece = read(path, offset, max_bytes).unwrap();
        if piece.data.is_empty() {
            assert_eq!(piece.next_offset, offset);
            return all;
        }
        all.extend_from_slice(&piece.data);
        offset = piece.next_offset;
    }
}

/// Writes `output` in chunks of `chunk` bytes under `cap`, and checks the files
/// on disk and what a reader from offset 0 gets: exactly the head, the marker
/// and the tail.
fn check_capped(output: &[u8], cap: u64, chunk: usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = log_in(dir.path());
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let cap = LogCap::new(cap).unwrap();
    let mut writer = LogWriter::open(&path, cap).unwrap();
    for piece in output.chunks(chunk) {
        writer.write(piece).unwrap();
        let on_disk: u64 = files_on_disk(&path)
            .iter()
            .filter(|(file, _)| *file != marker_path(&path))
            .map(|(_, len)| len)
            .sum();
        assert!(on_disk <= cap.bytes(), "{on_disk} bytes on disk");
    }
    assert_eq!(writer.end(), output.len() as u64);
    writer.finish().unwrap();

    let head_len = (cap.head() as usize).min(output.len());
    assert_eq!(std::fs::read(&path).unwrap(), &output[..head_len]);
    let segments = list_segments(&path).unwrap();
    let tail_start = segments.first().map_or(head_len, |s| s.start as usize);
    let mut tail = Vec::new();
    for segment in &segments {
        assert!(segment.len <= cap.segment());
        tail.extend(std::fs::read(super::segment_path(&path, segment.start)).unwrap());
    }
    assert_eq!(tail, &output[tail_start..], "the tail is the last bytes");
    let mut expected = output[..head_len].to_vec();
    if tail_start > head_len {
        let marker = marker_line(
            (tail_start - head_len) as u64,
            head_len as u64,
            (output.len() - tail_start) as u64,
        );
        assert_eq!(std::fs::read_to_string(marker_path(&path)).unwrap(), marker);
        if expected.last() != Some(&b'\n') {
            expected.push(b'\n');
        }
        expected.extend_from_slice(marker.as_bytes());
        assert!(output.len() - tail_start >= 3 * cap.segment() as usize);
    } else {
        assert!(!marker_path(&path).exists());
    }
    expected.extend_from_slice(&output[tail_start..]);
    for max_bytes in [1, 100, 1 << 20] {
        assert_eq!(read_all(&path, max_bytes), expected, "reads of {max_bytes}");
    }
}

#[test]
fn the_log_keeps_its_head_and_tail_within_the_cap() {
    let cap = MIN_LOG_CAP;
    // Under the cap: everything, no marker.
    check_capped(&stream(1000), cap, 64);
    check_capped(&stream(cap as usize), cap, 7);
    // Past the cap, written in small, odd and large chunks.
    for chunk in [1, 100, 511, 512, 4096, 100_000] {
        check_capped(&stream(50_000), cap, chunk);
    }
    // Just past the head; just past the tail's first segments.
    check_capped(&stream(cap as usize / 2 + 3), cap, 1000);
    check_capped(&stream(cap as usize + 1), cap, 1000);
    check_capped(&stream(10 * cap as usize), 3 * cap + 7, 333);
}

#[test]
fn the_smallest_cap_is_enforced() {
    assert!(LogCap::new(MIN_LOG_CAP - 1).is_err());
    assert_eq!(LogCap::new(MIN_LOG_CAP).unwrap().head(), MIN_LOG_CAP / 2);
}

/// A follower reading while the writer writes: every piece is the stream's bytes
/// at its offsets, or a marker that moves it to the oldest byte still kept.
/// Returns how many markers it was answered.
fn check_follow(output: &[u8], write_chunk: usize, read_max: u32, reads_per_write: usize) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let path = log_in(dir.path());
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let cap = LogCap::new(MIN_LOG_CAP).unwrap();
    let mut writer = LogWriter::open(&path, cap).unwrap();
    let mut offset = 0u64;
    let mut received = 0usize;
    let mut markers = 0;
    let mut follow = |offset: &mut u64| {
        for _ in 0..reads_per_write {
            let piece = read(&path, *offset, read_max).unwrap();
            let start = *offset as usize;
            let next = piece.next_offset as usize;
            assert!(next >= start, "never backwards");
            if next <= output.len() && piece.data == output[start..next] {
                received += piece.data.len();
            } else {
                let oldest = list_segments(&path).unwrap()[0].start;
                assert_eq!(
                    piece.next_offset, oldest,
                    "a marker moves to the oldest kept byte"
                );
                let text = String::from_utf8(piece.data).unwrap();
                assert!(
                    text.contains(&format!("[xp: {} bytes dropped here;", next - start)),
                    "{text}"
                );
                markers += 1;
            }
            *offset = piece.next_offset;
        }
    };
    for piece in output.chunks(write_chunk) {
        writer.write(piece).unwrap();
        follow(&mut offset);
    }
    writer.finish().unwrap();
    loop {
        let before = offset;
        follow(&mut offset);
        if offset == before {
            break;
        }
    }
    assert_eq!(offset, output.len() as u64, "caught up");
    assert!(received >= cap.head() as usize);
    markers
}

#[test]
fn a_follower_never_repeats_or_skips_kept_bytes() {
    let output = stream(40_000);
    // Keeping up: every byte is read before it is dropped, so no marker.
    assert_eq!(check_follow(&output, 100, 1 << 20, 1), 0);
    assert_eq!(check_follow(&output, 1, 1, 1), 0);
    // Behind in the head: one marker, from the head's end to the tail.
    assert_eq!(check_follow(&output, 3000, 50, 1), 1);
    // Falling behind in the tail, again and again.
    assert!(check_follow(&output, 100, 60, 1) > 1);
    assert!(check_follow(&output, 1000, 7, 30) > 1);
}

#[test]
fn a_log_opened_again_continues_after_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let path = log_in(dir.path());
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let cap = LogCap::new(MIN_LOG_CAP).unwrap();
    let output = stream(20_000);
    let (first, second) = output.split_at(9_000);
    let mut writer = LogWriter::open(&path, cap).unwrap();
    writer.write(first).unwrap();
    writer.finish().unwrap();
    let mut writer = LogWriter::open(&path, cap).unwrap();
    assert_eq!(writer.end(), first.len() as u64);
    writer.write(second).unwrap();
    writer.finish().unwrap();
    let all = read_all(&path, 1 << 20);
    assert!(all.starts_with(&output[..cap.head() as usize]));
    assert!(all.ends_with(&output[output.len() - 3 * cap.segment() as usize..]));
}

#[test]
fn reading_a_log_that_was_never_written_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        read(&log_in(dir.path()), 0, 100),
        Err(super::LogError::NotFound { .. })
    ));
}

/// Runs `sh -c script` as a worker under `cap`; returns its reports and its log.
async fn must_run_worker(dir: &Path, script: &str, cap: LogCap) -> (Vec<WorkerReport>, PathBuf) {
    run_worker(dir, script, cap, tokio_util::sync::CancellationToken::new()).await
}

/// The same, on a node whose drain is `node_draining`.
async fn run_worker(
    dir: &Path,
    script: &str,
    cap: LogCap,
    node_draining: tokio_util::sync::CancellationToken,
) -> (Vec<WorkerReport>, PathBuf) {
    let store = Arc::new(ObjectStore::open(dir.join("objects"), StoreLimits::default()).unwrap());
    let key = WorkerKey {
        trial: TrialId {
            experiment: ExperimentId::from_content_hash(&[7; 32], 1),
            index: 0,
        },
        attempt: 1,
        rank: 0,
    };
    let argv = vec!["sh".to_owned(), "-c".to_owned(), script.to_owned()];
    let log_path = log_in(dir);
    let (launch, command) = crate::test_util::solo_worker(dir, key, argv, log_path.clone(), store);
    let (reports_tx, mut reports_rx) = mpsc::unbounded_channel();
    let (_stop_tx, stop_rx) = oneshot::channel();
    supervise(
        launch,
        command,
        cap,
        reports_tx,
        stop_rx,
        crate::telemetry::Targets::default(),
        node_draining,
    )
    .await;
    let mut reports = Vec::new();
    while let Some(report) = reports_rx.recv().await {
        reports.push(report);
    }
    (reports, log_path)
}

#[tokio::test]
async fn a_worker_ending_on_its_own_while_the_node_drains_is_stopped_not_failed() {
    // Slurm signals every process of a job that ends, so a worker may die of that
    // SIGTERM before its node asks it to stop: its trial must move, not fail.
    let draining = tokio_util::sync::CancellationToken::new();
    draining.cancel();
    let dir = tempfile::tempdir().unwrap();
    let (reports, _) = run_worker(
        dir.path(),
        "kill -TERM $$",
        LogCap::default(),
        draining.clone(),
    )
    .await;
    assert!(
        matches!(reports.last(), Some(WorkerReport::Stopped { reason, .. }) if reason.contains("draining")),
        "{reports:?}"
    );
    // One that succeeds meanwhile has succeeded.
    let dir = tempfile::tempdir().unwrap();
    let (reports, _) = run_worker(dir.path(), "exit 0", LogCap::default(), draining).await;
    assert!(
        matches!(
            reports.last(),
            Some(WorkerReport::Exited { code: Some(0), .. })
        ),
        "{reports:?}"
    );
    // On a node that is not draining, a failure is the worker's.
    let dir = tempfile::tempdir().unwrap();
    let (reports, _) = must_run_worker(dir.path(), "exit 3", LogCap::default()).await;
    assert!(
        matches!(
            reports.last(),
            Some(WorkerReport::Exited { code: Some(3), .. })
        ),
        "{reports:?}"
    );
}

#[tokio::test]
async fn a_worker_printing_past_the_cap_keeps_head_tail_and_every_metric() {
    let dir = tempfile::tempdir().unwrap();
    let output_path = dir.path().join("output.txt");
    let metric_lines = crate::test_util::generate_output(&output_path, 300_000).unwrap();
    // A metric line too long to parse, then one more good one, then stderr.
    let long = format!("XP_METRIC {{\"x\": \"{}\"}}", "y".repeat(100_000));
    let script = format!(
        "cat '{}'; echo '{long}'; echo 'XP_METRIC {{\"step\": 1, \"last\": 2}}'; echo bye >&2",
        output_path.display()
    );
    let cap = LogCap::new(64 << 10).unwrap();
    let (reports, log) = must_run_worker(dir.path(), &script, cap).await;
    let metrics: Vec<u64> = reports
        .iter()
        .filter_map(|report| match report {
            WorkerReport::Metric { index, .. } => Some(*index),
            _ => None,
        })
        .collect();
    assert_eq!(metrics, (1..=metric_lines + 1).collect::<Vec<_>>());
    assert!(matches!(
        reports.last(),
        Some(WorkerReport::Exited { code: Some(0), .. })
    ));
    let output = std::fs::read(&output_path).unwrap();
    let all = read_all(&log, 1 << 20);
    let text = String::from_utf8(all).unwrap();
    assert!(text.as_bytes().starts_with(&output[..cap.head() as usize]));
    let marker_at = text.find("[xp: ").expect("a marker");
    assert!(
        marker_at == cap.head() as usize
            || (marker_at == cap.head() as usize + 1 && text[..marker_at].ends_with('\n')),
        "the marker starts a line of its own right after the head"
    );
    let end = &text[text.len() - 200..];
    assert!(
        end.contains("\nXP_METRIC {\"step\": 1, \"last\": 2}\n"),
        "{end}"
    );
    assert!(end.contains("\nbye\n"), "stderr is in the log: {end}");
    let kept: u64 = files_on_disk(&log).iter().map(|(_, len)| len).sum();
    assert!(kept <= cap.bytes() + 200, "{kept} bytes kept");
}
