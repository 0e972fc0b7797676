//! Ring all-reduce time, algorithm bandwidth and bus bandwidth per transport, size
//! and world size, held against ceilings measured in the same run: one QUIC
//! connection, one loopback TCP stream and a single-threaded memory copy.
//!
//! `cargo bench --bench allreduce -- [--workers W] [--size BYTES | --sizes LIST]
//! [--transport quic|tcp|shm] [--json]`. Sizes take K, M and G suffixes (powers of
//! two). Without options: W = 2 and 4, every transport, 4K,1M,16M,64M,256M.
//!
//! The ceilings are measured before and after the all-reduces and the better of the
//! two counts, so a slow spell on a shared machine lowers no ceiling; results are
//! printed once both are known.
#![allow(clippy::print_stdout, reason = "a bench binary reports on stdout")]
#![allow(
    clippy::print_stderr,
    reason = "a bench binary reports usage errors on stderr"
)]

use anyhow::Context as _;
use xp_runtime::collective::bench::{AllReduceMeasurement, Ceilings, bench_allreduce, ceilings};
use xp_runtime::collective::{CollectiveConfig, TransportKind};

struct Options {
    workers: Vec<u32>,
    sizes: Vec<usize>,
    transports: Vec<TransportKind>,
    json: bool,
}

fn parse_size(text: &str) -> anyhow::Result<usize> {
    let text = text.trim();
    let (digits, shift) = match text.chars().last() {
        Some('K' | 'k') => (&text[..text.len() - 1], 10),
        Some('M' | 'm') => (&text[..text.len() - 1], 20),
        Some('G' | 'g') => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    let value: usize = digits
        .parse()
        .with_context(|| format!("bad size {text:?}"))?;
    Ok(value << shift)
}

fn parse_options() -> anyhow::Result<Options> {
    let mut options = Options {
        workers: vec![2, 4],
        sizes: ["4K", "1M", "16M", "64M", "256M"]
            .iter()
            .map(|size| parse_size(size))
            .collect::<anyhow::Result<_>>()?,
        transports: vec![TransportKind::Tcp, TransportKind::Shm, TransportKind::Quic],
        json: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--workers" => {
                options.workers = vec![value("--workers")?.parse().context("bad --workers")?]
            }
            "--size" => options.sizes = vec![parse_size(&value("--size")?)?],
            "--sizes" => {
                options.sizes = value("--sizes")?
                    .split(',')
                    .map(parse_size)
                    .collect::<anyhow::Result<_>>()?;
            }
            "--transport" => {
                options.transports =
                    vec![value("--transport")?.parse().map_err(anyhow::Error::msg)?];
            }
            "--json" => options.json = true,
            // cargo bench passes --bench to every bench binary.
            "--bench" => {}
            other => anyhow::bail!("unknown option {other:?}"),
        }
    }
    Ok(options)
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

/// The ceiling a transport's bus bandwidth is judged against, and the target ratio.
fn target(kind: TransportKind, ceilings: &Ceilings) -> (f64, f64) {
    match kind {
        TransportKind::Quic => (ceilings.quic_p2p_gbps, 0.7),
        TransportKind::Tcp => (ceilings.tcp_loopback_gbps, 0.5),
        TransportKind::Shm => (ceilings.memcpy_gbps, 0.4),
    }
}

fn report(measurement: &AllReduceMeasurement, ceilings: &Ceilings, json: bool) {
    let (ceiling, goal) = target(measurement.transport, ceilings);
    if json {
        let line = serde_json::json!({
            "size_bytes": measurement.size_bytes,
            "workers": measurement.workers,
            "transport": measurement.transport.name(),
            "algorithm": format!("{:?}", measurement.algorithm),
            "iterations": measurement.iterations,
            "time_s": measurement.time_s,
            "algbw_gbps": measurement.algbw_gbps,
            "busbw_gbps": measurement.busbw_gbps,
            "cpu_cores": measurement.cpu_cores,
            "quic_p2p_gbps": ceilings.quic_p2p_gbps,
            "quic_p2p_cpu_cores": ceilings.quic_p2p_cpu_cores,
            "quic_p2p_default_gbps": ceilings.quic_p2p_default_gbps,
            "tcp_loopback_gbps": ceilings.tcp_loopback_gbps,
            "memcpy_gbps": ceilings.memcpy_gbps,
            "busbw_over_ceiling": measurement.busbw_gbps / ceiling,
            "target_ratio": goal,
        });
        println!("{line}");
    } else {
        println!(
            "{:<5} {:>2} {:>6} {:<12} {:>10.4} ms {:>8.3} {:>8.3} {:>9.2} {:>6.2} (target {:.1})",
            measurement.transport.name(),
            measurement.workers,
            human(measurement.size_bytes),
            format!("{:?}", measurement.algorithm),
            measurement.time_s * 1e3,
            measurement.algbw_gbps,
            measurement.busbw_gbps,
            measurement.busbw_gbps / ceiling,
            measurement.cpu_cores,
            goal,
        );
    }
}

fn main() -> anyhow::Result<()> {
    let options = match parse_options() {
        Ok(options) => options,
        Err(error) => {
            eprintln!("{error:#}");
            eprintln!(
                "usage: cargo bench --bench allreduce -- [--workers W] [--size BYTES | --sizes LIST] [--transport quic|tcp|shm] [--json]"
            );
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(async {
        let config = CollectiveConfig::default();
        let before = ceilings(256 << 20, &config).await.context("measuring the ceilings")?;
        let mut all = Vec::new();
        for &kind in &options.transports {
            for &workers in &options.workers {
                let measurements = bench_allreduce(workers, &options.sizes, kind)
                    .await
                    .with_context(|| format!("{} with {workers} workers", kind.name()))?;
                all.extend(measurements);
            }
        }
        let after = ceilings(256 << 20, &config).await.context("measuring the ceilings")?;
        let ceilings = Ceilings {
            quic_p2p_gbps: before.quic_p2p_gbps.max(after.quic_p2p_gbps),
            quic_p2p_cpu_cores: if before.quic_p2p_gbps >= after.quic_p2p_gbps {
                before.quic_p2p_cpu_cores
            } else {
                after.quic_p2p_cpu_cores
            },
            quic_p2p_default_gbps: before.quic_p2p_default_gbps.max(after.quic_p2p_default_gbps),
            tcp_loopback_gbps: before.tcp_loopback_gbps.max(after.tcp_loopback_gbps),
            memcpy_gbps: before.memcpy_gbps.max(after.memcpy_gbps),
        };
        if !options.json {
            println!(
                "ceilings: quic p2p {:.3} GB/s ({:.2} cores; quinn defaults {:.3} GB/s), tcp loopback {:.3} GB/s, memcpy {:.3} GB/s",
                ceilings.quic_p2p_gbps,
                ceilings.quic_p2p_cpu_cores,
                ceilings.quic_p2p_default_gbps,
                ceilings.tcp_loopback_gbps,
                ceilings.memcpy_gbps
            );
            println!(
                "{:<5} {:>2} {:>6} {:<12} {:>13} {:>8} {:>8} {:>9} {:>6}",
                "link", "W", "size", "algorithm", "time", "algbw", "busbw", "/ceiling", "cores"
            );
        }
        for measurement in &all {
            report(measurement, &ceilings, options.json);
        }
        anyhow::Ok(())
    })
}
