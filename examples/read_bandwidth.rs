//! Measures the machine's memory read bandwidth, the roofline of a decoding step (which
//! streams every weight and the state once): `cargo run --release --example
//! read_bandwidth -- [THREADS] [MIB] [ROUNDS]`. Each of THREADS threads sums its share of
//! a MIB-MiB f32 buffer (far larger than the caches) with independent accumulators, ROUNDS
//! times; prints one JSON line with the best and median GB/s (10⁹ bytes per second) over
//! the rounds. bench/generation.py runs it in the same run as the steps it compares.

use std::time::Instant;

/// Sum of `data` with 16 independent accumulators (the loop the compiler vectorizes; the
/// memory, not the adds, is the limit).
fn sum(data: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let chunks = data.chunks_exact(16);
    let rest: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    acc.iter().sum::<f32>() + rest
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().unwrap_or_else(|| "2".into()).parse()?;
    let mib: usize = args.next().unwrap_or_else(|| "1024".into()).parse()?;
    let rounds: usize = args.next().unwrap_or_else(|| "10".into()).parse()?;
    anyhow::ensure!(
        threads >= 1 && mib >= 1 && rounds >= 1,
        "usage: read_bandwidth [THREADS ≥ 1] [MIB ≥ 1] [ROUNDS ≥ 1]"
    );
    let len = mib * (1 << 20) / 4;
    // Written once (every page touched) with values whose sum cannot be folded away.
    let data: Vec<f32> = (0..len).map(|k| (k % 7) as f32).collect();
    let share = len.div_ceil(threads);
    let mut rates = Vec::with_capacity(rounds);
    let mut check = 0f32;
    for _ in 0..rounds {
        let start = Instant::now();
        let total: f32 = std::thread::scope(|s| {
            let handles: Vec<_> = data
                .chunks(share)
                .map(|part| s.spawn(move || sum(part)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(f32::NAN))
                .sum()
        });
        let seconds = start.elapsed().as_secs_f64();
        check += total;
        rates.push((len * 4) as f64 / seconds / 1e9);
    }
    rates.sort_by(f64::total_cmp);
    println!(
        "{{\"threads\": {threads}, \"mib\": {mib}, \"rounds\": {rounds}, \"best_gb_s\": {:.2}, \"median_gb_s\": {:.2}, \"checksum\": {check}}}",
        rates[rates.len() - 1],
        rates[rates.len() / 2]
    );
    Ok(())
}
