//! How long planning an epoch takes at scale, and how much memory it needs.
//!
//! One epoch of 10 million samples in 100,000 uneven shards (0.1 % invalid), as one rank of
//! world size 64 with 8 DataLoader workers sees it: build the plan, make the rank's 8 reader
//! plans, walk one reader's emitted order; then an elastic resume of the half-done epoch onto
//! 48 ranks. Then the index of such a dataset: JSON size (plain and gzip) and parse time.
//!
//! Run: `cargo bench --bench bench_plan`. Target: planning well under a second, memory in tens
//! of MB (it grows with shards and invalid samples, not with samples).

use shardstream::index::{Index, ShardEntry};
use shardstream::plan::{EpochPlan, PhaseConfig, PlanInput, ShardCounts};
use shardstream::rng::SplitMix64;
use std::time::Instant;

const SHARDS: usize = 100_000;
const MEAN_SAMPLES: u64 = 100;

/// Peak resident memory of this process so far, in MiB (VmHWM of /proc/self/status).
fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    kib / 1024.0
}

/// Uneven shard sizes that add up to exactly SHARDS x MEAN_SAMPLES, with 0.1 % invalid samples.
fn dataset() -> Vec<ShardCounts> {
    let mut rng = SplitMix64::new(7);
    let mut counts = vec![MEAN_SAMPLES; SHARDS];
    for pair in counts.chunks_mut(2) {
        let d = rng.below(MEAN_SAMPLES / 2);
        pair[0] += d;
        pair[1] -= d;
    }
    counts
        .into_iter()
        .map(|n| {
            let invalid = (0..n).filter(|_| rng.below(1000) == 0).collect();
            ShardCounts {
                num_samples: n,
                invalid,
            }
        })
        .collect()
}

fn main() {
    let shards = dataset();
    let input = PlanInput::new(shards, 1).expect("valid counts");
    let before = peak_rss_mib();
    println!(
        "dataset: {} shards, {} valid samples; peak RSS after building the counts: {before:.1} MiB",
        input.shards().len(),
        input.num_valid()
    );

    let config = PhaseConfig {
        world_size: 64,
        workers: 8,
        batch_size: 256,
        block_size: 10_000,
        drop_last: true,
    };
    let t = Instant::now();
    let plan = EpochPlan::new(&input, 1234, 3, config).expect("plan");
    let plan_time = t.elapsed();
    let t = Instant::now();
    let readers: Vec<_> = (0..8)
        .map(|w| plan.reader(17, w).expect("reader"))
        .collect();
    let reader_time = t.elapsed();
    let runs: usize = readers.iter().map(|r| r.runs().len()).sum();
    let samples: u64 = readers.iter().map(|r| r.num_samples()).sum();
    println!(
        "plan W=64 K=8 B=256 C=10000: {:.1} ms; rank 17's 8 reader plans: {:.2} ms \
         ({samples} samples in {runs} runs, {} batches per rank, remainder {})",
        plan_time.as_secs_f64() * 1e3,
        reader_time.as_secs_f64() * 1e3,
        plan.num_batches(),
        plan.remainder_len()
    );
    let t = Instant::now();
    let walked = readers[3].emitted().count();
    println!(
        "emitted order of one reader: {walked} samples in {:.2} ms",
        t.elapsed().as_secs_f64() * 1e3
    );

    let plan_peak = peak_rss_mib();
    println!(
        "PLAN: {:.3} s for one rank (target < 1 s); peak RSS {plan_peak:.1} MiB ({:.1} MiB above the counts)",
        (plan_time + reader_time).as_secs_f64(),
        plan_peak - before
    );

    // Resume where every reader is half-way through a block: the most scattered leftovers
    // (about block_size / 4 runs per old reader), so the worst case for time and memory.
    let resume_at = 8 * (config.block_size / 2).div_ceil(config.batch_size);
    let state = plan.state(resume_at, &[]).expect("state");
    let state_json = state.to_json();
    let elastic = PhaseConfig {
        world_size: 48,
        ..config
    };
    let t = Instant::now();
    let resumed = EpochPlan::resume(&input, &state, elastic).expect("resume");
    let resumed_readers: Vec<_> = (0..8)
        .map(|w| resumed.reader(17, w).expect("reader"))
        .collect();
    let resume_time = t.elapsed();
    let resumed_runs: usize = resumed_readers.iter().map(|r| r.runs().len()).sum();
    println!(
        "elastic resume at batch {} onto W=48: {:.1} ms, {} batches per rank left, rank 17 reads {resumed_runs} runs; \
         state is {} bytes",
        resume_at,
        resume_time.as_secs_f64() * 1e3,
        resumed.num_batches(),
        state_json.len()
    );
    println!(
        "RESUME: peak RSS {:.1} MiB (each old reader's half-emitted block leaves up to block_size scattered samples)",
        peak_rss_mib()
    );
    drop((plan, readers, resumed, resumed_readers));

    // The index of such a dataset: 60-120 kB samples, offsets on tar blocks.
    let mut rng = SplitMix64::new(9);
    let entries: Vec<ShardEntry> = input
        .shards()
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut e = ShardEntry::new(format!("s3://bucket/laion/{i:06}.tar"), c.num_samples);
            let mut at = 0;
            let offsets: Vec<u64> = (0..=c.num_samples)
                .map(|_| {
                    let o = at;
                    at += 512 * (120 + rng.below(120));
                    o
                })
                .collect();
            e.size = Some(offsets[c.num_samples as usize] + 1024);
            e.extra_mut().offsets = Some(offsets);
            e
        })
        .collect();
    let index = Index::new(entries).expect("index");
    let t = Instant::now();
    let json = index.to_json();
    let write_time = t.elapsed();
    let gz = index.to_json_gz();
    let t = Instant::now();
    let parsed = Index::from_json(&json).expect("parse");
    let parse_time = t.elapsed();
    let t = Instant::now();
    Index::from_json(&gz).expect("parse gz");
    let parse_gz_time = t.elapsed();
    assert_eq!(parsed.num_samples(), index.num_samples());
    println!(
        "INDEX: {} samples: JSON {:.1} MB (gzip {:.1} MB); write {:.2} s, parse {:.2} s, parse gzip {:.2} s; \
         peak RSS {:.0} MiB",
        index.num_samples(),
        json.len() as f64 / 1e6,
        gz.len() as f64 / 1e6,
        write_time.as_secs_f64(),
        parse_time.as_secs_f64(),
        parse_gz_time.as_secs_f64(),
        peak_rss_mib()
    );
}
