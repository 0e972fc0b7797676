//! Throwaway check for examples/quickstart/digits.rs.
#![allow(clippy::print_stdout)]
#[path = "quickstart/digits.rs"]
mod digits;

fn main() -> anyhow::Result<()> {
    let configs = [
        ("good sgd lr0.1 h64 e30 b32", 0.1, 64, 30, 32),
        ("good sgd lr0.05 h64 e30 b32", 0.05, 64, 30, 32),
        ("bad lr1e-4 h4 e5 b32", 1e-4, 4, 5, 32),
        ("mid lr1e-3 h16 e10 b32", 1e-3, 16, 10, 32),
        ("large lr0.5 h128 e40 b32", 0.5, 128, 40, 32),
        ("lr0.01 h32 e20 b32", 0.01, 32, 20, 32),
    ];
    let args: Vec<String> = std::env::args().collect();
    for (name, lr, hidden, epochs, batch) in configs {
        for seed in [0_u64, 1, 2] {
            let cfg = digits::DigitsConfig { learning_rate: lr, hidden, epochs, batch_size: batch, weight_decay: 0.0, seed };
            let t = std::time::Instant::now();
            let mut n = 0;
            let r = digits::train(&cfg, |r| { n += 1; if args.len() > 1 { println!("  {} {:.4} {:.4} {:.4}", r.epoch, r.train_loss, r.val_loss, r.val_accuracy); } });
            match r {
                Ok(r) => println!("{name} seed{seed}: epoch {} train_loss {:.4} val_loss {:.4} val_acc {:.4} ({n} callbacks) in {:.2}s", r.epoch, r.train_loss, r.val_loss, r.val_accuracy, t.elapsed().as_secs_f64()),
                Err(e) => println!("{name} seed{seed}: error {e:#} in {:.2}s", t.elapsed().as_secs_f64()),
            }
        }
    }
    let bad = digits::DigitsConfig { learning_rate: f64::NAN, hidden: 0, epochs: 1, batch_size: 1, weight_decay: 0.0, seed: 0 };
    println!("invalid: {:#}", digits::train(&bad, |_| {}).err().map(|e| format!("{e:#}")).unwrap_or_default());
    Ok(())
}
