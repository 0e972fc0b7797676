//! A trial that hands its object capability to a test, for the end-to-end
//! tests of object access by capability (`tests/object_capabilities.rs`): a
//! command trial that stores a checkpoint, asks its node for its attempt's
//! capability on the local object channel, writes it (JSON) to
//! `EXCHANGE/capability.json` as a thief would, and waits for
//! `EXCHANGE/done` before it ends, so that the test can use the capability
//! while the attempt lives and replay it once it ended.
//!
//! `object_probe EXCHANGE`.
#![allow(clippy::print_stderr, reason = "a probe's findings are for its log")]

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use xp::TrialContext;

fn main() -> anyhow::Result<()> {
    let exchange: PathBuf = std::env::args()
        .nth(1)
        .context("usage: object_probe EXCHANGE")?
        .into();
    let ctx = TrialContext::from_env().context("not run as a trial")?;
    ctx.checkpoint(1, b"the probe's own checkpoint")
        .context("store a checkpoint")?;
    let capability = ctx
        .object_capability()
        .context("ask the node for the capability")?;
    let text = serde_json::to_string(&capability).context("write the capability as JSON")?;
    let written = exchange.join("capability.json.tmp");
    std::fs::write(&written, text).context("leave the capability for the test")?;
    std::fs::rename(&written, exchange.join("capability.json")).context("publish it")?;
    eprintln!("capability handed over; waiting for {}", exchange.display());
    while !exchange.join("done").exists() {
        #[expect(
            clippy::disallowed_methods,
            reason = "a probe polls for the test's signal"
        )]
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}
