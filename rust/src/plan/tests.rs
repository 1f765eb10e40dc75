//! Tests of the plan as a whole: the contracts of docs/epoch-plan.md on many datasets.

use super::*;
use crate::rng::SplitMix64;
use std::collections::{HashMap, HashSet};

type Sample = (u32, u64);

/// Uneven shards: a 1-sample shard, an empty one, invalid samples (one shard all invalid).
fn uneven_input() -> PlanInput {
    let shape: [(u64, &[u64]); 8] = [
        (17, &[0, 5, 6]),
        (1, &[]),
        (23, &[22]),
        (0, &[]),
        (40, &[10, 11, 12, 39]),
        (3, &[0, 1, 2]),
        (9, &[]),
        (31, &[30, 0]),
    ];
    let shards = shape
        .iter()
        .map(|&(n, bad)| ShardCounts {
            num_samples: n,
            invalid: bad.to_vec().into(),
        })
        .collect();
    PlanInput::new(shards, 77).unwrap()
}

fn valid_samples(input: &PlanInput) -> HashSet<Sample> {
    let mut all = HashSet::new();
    for (s, c) in input.shards().iter().enumerate() {
        for o in 0..c.num_samples {
            if c.invalid.binary_search(&o).is_err() {
                all.insert((s as u32, o));
            }
        }
    }
    all
}

fn expand(runs: &[Run]) -> Vec<Sample> {
    runs.iter()
        .flat_map(|r| (r.start..r.end).map(move |o| (r.shard, o)))
        .collect()
}

/// A reader's emitted samples cut into its batches (checks the counts on the way).
fn reader_batches(reader: &ReaderPlan) -> Vec<Vec<Sample>> {
    let emitted: Vec<Sample> = reader.emitted().collect();
    assert_eq!(emitted.len() as u64, reader.num_samples());
    let mut batches = Vec::new();
    let mut rest = &emitted[..];
    for i in 0..reader.num_batches {
        let size = if i + 1 == reader.num_batches {
            reader.last_batch_size
        } else {
            reader.batch_size
        };
        batches.push(rest[..size as usize].to_vec());
        rest = &rest[size as usize..];
    }
    assert!(rest.is_empty());
    batches
}

/// What a rank yields, batch by batch, in DataLoader order.
fn rank_batches(plan: &EpochPlan, rank: u32) -> Vec<Vec<Sample>> {
    let readers: Vec<ReaderPlan> = (0..plan.config().readers_per_rank())
        .map(|w| plan.reader(rank, w).unwrap())
        .collect();
    let per_reader: Vec<Vec<Vec<Sample>>> = readers.iter().map(reader_batches).collect();
    let counts: Vec<u64> = readers.iter().map(|r| r.num_batches).collect();
    rank_batch_order(&counts)
        .into_iter()
        .map(|(w, j)| per_reader[w as usize][j as usize].clone())
        .collect()
}

fn all_batches(plan: &EpochPlan) -> Vec<Vec<Vec<Sample>>> {
    (0..plan.config().world_size)
        .map(|r| rank_batches(plan, r))
        .collect()
}

fn configs() -> Vec<PhaseConfig> {
    let mut out = Vec::new();
    for w in [1, 2, 3] {
        for k in [0, 2] {
            for (b, c) in [(1, 1), (3, 5), (4, 64), (5, 2)] {
                for drop_last in [true, false] {
                    out.push(PhaseConfig::new(w, k, b, c, drop_last));
                }
            }
        }
    }
    out
}

#[test]
fn every_valid_sample_exactly_once_minus_a_small_remainder() {
    for input in [uneven_input(), PlanInput::from_counts(&[5, 2])] {
        let valid = valid_samples(&input);
        for cfg in configs().into_iter().filter(|c| c.drop_last) {
            let plan = EpochPlan::new(&input, 3, 1, cfg).unwrap();
            let ranks = all_batches(&plan);
            let mut seen = HashSet::new();
            for batches in &ranks {
                assert_eq!(batches.len() as u64, plan.num_batches(), "{cfg:?}");
                for batch in batches {
                    assert_eq!(batch.len() as u64, cfg.batch_size);
                    for &s in batch {
                        assert!(seen.insert(s), "{s:?} twice under {cfg:?}");
                    }
                }
            }
            let remainder = expand(&plan.remainder());
            assert_eq!(remainder.len() as u64, plan.remainder_len());
            assert!(plan.remainder_len() < cfg.global_batch());
            for &s in &remainder {
                assert!(seen.insert(s), "{s:?} yielded and in the remainder");
            }
            assert_eq!(seen, valid, "{cfg:?}");
            // The reserves split the remainder, each sample to one reader.
            let mut reserve: Vec<Sample> = Vec::new();
            for r in 0..cfg.world_size {
                for w in 0..cfg.readers_per_rank() {
                    reserve.extend(expand(plan.reader(r, w).unwrap().reserve()));
                }
            }
            reserve.sort_unstable();
            let mut sorted = remainder.clone();
            sorted.sort_unstable();
            assert_eq!(reserve, sorted);
        }
    }
}

#[test]
fn without_drop_last_every_sample_appears_and_short_batches_match_across_ranks() {
    for input in [
        uneven_input(),
        PlanInput::from_counts(&[5, 2]),
        PlanInput::from_counts(&[1]),
    ] {
        let valid = valid_samples(&input);
        for cfg in configs().into_iter().filter(|c| !c.drop_last) {
            let plan = EpochPlan::new(&input, 3, 1, cfg).unwrap();
            let ranks = all_batches(&plan);
            let sizes: Vec<usize> = ranks[0].iter().map(Vec::len).collect();
            let mut counts: HashMap<Sample, u64> = HashMap::new();
            for batches in &ranks {
                assert_eq!(
                    batches.iter().map(Vec::len).collect::<Vec<_>>(),
                    sizes,
                    "{cfg:?}"
                );
                for &s in batches.iter().flatten() {
                    *counts.entry(s).or_default() += 1;
                }
            }
            assert_eq!(counts.keys().copied().collect::<HashSet<_>>(), valid);
            let repeats: u64 = counts.values().map(|c| c - 1).sum();
            assert_eq!(repeats, plan.padding(), "{cfg:?}");
            assert!(plan.padding() < cfg.world_size as u64);
            assert_eq!(plan.remainder_len(), 0);
        }
    }
}

#[test]
fn same_inputs_give_the_same_order_and_epochs_and_seeds_differ() {
    let input = uneven_input();
    let cfg = PhaseConfig::new(2, 2, 3, 5, true);
    let a = all_batches(&EpochPlan::new(&input, 9, 4, cfg).unwrap());
    assert_eq!(a, all_batches(&EpochPlan::new(&input, 9, 4, cfg).unwrap()));
    assert_ne!(a, all_batches(&EpochPlan::new(&input, 9, 5, cfg).unwrap()));
    assert_ne!(a, all_batches(&EpochPlan::new(&input, 10, 4, cfg).unwrap()));
    // Within-shard order changes too, not only the shard order.
    let big = PlanInput::from_counts(&[1000]);
    let one = PhaseConfig::new(1, 0, 10, 1, true);
    let e0: Vec<_> = rank_batches(&EpochPlan::new(&big, 0, 0, one).unwrap(), 0);
    let e1: Vec<_> = rank_batches(&EpochPlan::new(&big, 0, 1, one).unwrap(), 0);
    assert_ne!(e0[0][0], e1[0][0]);
}

#[test]
fn reading_stays_sequential() {
    // 200 shards of 500 samples, 6 readers, blocks of 64: each reader's runs are a handful
    // per shard it touches (the rotation splits a shard in two).
    let input = PlanInput::from_counts(&[500; 200]);
    let plan = EpochPlan::new(&input, 1, 0, PhaseConfig::new(3, 2, 32, 64, true)).unwrap();
    for r in 0..3 {
        for w in 0..2 {
            let reader = plan.reader(r, w).unwrap();
            let samples = reader.runs().iter().map(Run::len).sum::<u64>();
            assert_eq!(samples, reader.num_samples());
            let shards: HashSet<u32> = reader.runs().iter().map(|r| r.shard).collect();
            assert!(
                reader.runs().len() <= 2 * shards.len() + 1,
                "{} runs",
                reader.runs().len()
            );
            assert!(samples / reader.runs().len() as u64 > 200);
        }
    }
}

#[test]
fn round_robin_order_matches_reader_batches_done() {
    for k in 1..5u32 {
        for total in 0..20u64 {
            let counts: Vec<u64> = (0..k)
                .map(|w| total / k as u64 + u64::from((w as u64) < total % k as u64))
                .collect();
            let order = rank_batch_order(&counts);
            assert_eq!(order.len() as u64, total);
            for n in 0..=total {
                for w in 0..k {
                    let done = order[..n as usize].iter().filter(|(x, _)| *x == w).count() as u64;
                    assert_eq!(reader_batches_done(n, k, w), done);
                }
            }
        }
    }
}

#[test]
fn resume_with_the_same_configuration_continues_exactly() {
    let input = uneven_input();
    for cfg in configs() {
        let plan = EpochPlan::new(&input, 5, 2, cfg).unwrap();
        let full = all_batches(&plan);
        for n in 0..=plan.num_batches() {
            let json = plan.state(n, &[]).unwrap().to_json();
            let state = EpochState::from_json(json.as_bytes()).unwrap();
            let resumed = EpochPlan::resume(&input, &state, cfg).unwrap();
            assert_eq!(resumed.num_batches(), plan.num_batches() - n);
            let rest = all_batches(&resumed);
            for rank in 0..cfg.world_size as usize {
                assert_eq!(rest[rank][..], full[rank][n as usize..], "{cfg:?} n={n}");
            }
            // And a second resume later in the same phase.
            let m = (plan.num_batches() - n) / 2;
            let again = EpochPlan::resume(&input, &resumed.state(m, &[]).unwrap(), cfg).unwrap();
            for (rank, batches) in all_batches(&again).iter().enumerate() {
                assert_eq!(batches[..], full[rank][(n + m) as usize..]);
            }
        }
    }
}

/// Runs an epoch through a chain of configurations, stopping after the given batch counts,
/// and checks that nothing is yielded twice and nothing but the final remainder is lost
/// (a `drop_last = false` phase may repeat up to its padding, with its short batch).
fn run_chain(input: &PlanInput, chain: &[(PhaseConfig, u64)], seed: u64) {
    let mut counts: HashMap<Sample, u64> = HashMap::new();
    let mut allowed_repeats = 0;
    let mut plan = EpochPlan::new(input, seed, 6, chain[0].0).unwrap();
    for i in 0..=chain.len() {
        let last = i == chain.len();
        if i > 0 && !last {
            let json = plan
                .state(chain[i - 1].1.min(plan.num_batches()), &[])
                .unwrap()
                .to_json();
            let state = EpochState::from_json(json.as_bytes()).unwrap();
            plan = EpochPlan::resume(input, &state, chain[i].0).unwrap();
        }
        // Phase i yields its first `stop` batches; after the chain, the last phase finishes.
        let stop = chain[i.min(chain.len() - 1)].1.min(plan.num_batches());
        let range = if last {
            stop..plan.num_batches()
        } else {
            0..stop
        };
        if range.end == plan.num_batches() && !range.is_empty() {
            allowed_repeats += plan.padding();
        }
        for batches in all_batches(&plan) {
            assert_eq!(batches.len() as u64, plan.num_batches());
            for &s in batches[range.start as usize..range.end as usize]
                .iter()
                .flatten()
            {
                *counts.entry(s).or_default() += 1;
            }
        }
    }
    for s in expand(&plan.remainder()) {
        *counts.entry(s).or_default() += 1;
    }
    assert!(plan.remainder_len() < plan.config().global_batch());
    let repeats: u64 = counts.values().map(|c| c - 1).sum();
    assert!(
        repeats <= allowed_repeats,
        "{repeats} repeats in chain {chain:?}"
    );
    assert_eq!(
        counts.keys().copied().collect::<HashSet<_>>(),
        valid_samples(input),
        "chain {chain:?}"
    );
}

#[test]
fn elastic_resume_chains_are_exactly_once() {
    let inputs = [
        uneven_input(),
        PlanInput::from_counts(&[50, 1, 7, 33, 64, 2]),
    ];
    for input in &inputs {
        for (b, c) in [(2, 3), (4, 7), (3, 1)] {
            for stops in [
                (0, 0, 0),
                (1, 1, 0),
                (2, 3, 1),
                (3, 0, 2),
                (5, 4, 100),
                (100, 2, 1),
            ] {
                let chain = [
                    (PhaseConfig::new(3, 2, b, c, true), stops.0),
                    (PhaseConfig::new(2, 0, b, c, true), stops.1),
                    (PhaseConfig::new(3, 2, b, c, true), stops.2),
                ];
                run_chain(input, &chain, 11);
                // Batch and block sizes may change between phases as well.
                let chain = [
                    (PhaseConfig::new(3, 2, b, c, true), stops.0),
                    (PhaseConfig::new(1, 3, b + 1, c + 2, true), stops.1),
                    (PhaseConfig::new(2, 2, b, 1, true), stops.2),
                ];
                run_chain(input, &chain, 12);
            }
        }
    }
}

#[test]
fn elastic_resume_after_drop_last_false_short_batches() {
    let input = PlanInput::from_counts(&[10, 3, 8]);
    // 21 samples, W=2, B=4: 2 full batches per rank, then one short batch of 3 (1 repeat).
    let first = PhaseConfig::new(2, 2, 4, 3, false);
    let plan = EpochPlan::new(&input, 0, 0, first).unwrap();
    assert_eq!((plan.num_batches(), plan.padding()), (3, 1));
    for n in 0..=2 {
        run_chain(
            &input,
            &[(first, n), (PhaseConfig::new(3, 0, 2, 5, true), 1)],
            0,
        );
    }
}

#[test]
fn used_reserve_samples_are_not_planned_again() {
    // 47 samples, W=3, B=4: 3 batches per rank, tail of 11 as reserve.
    let input = PlanInput::from_counts(&[20, 27]);
    let cfg = PhaseConfig::new(3, 2, 4, 5, true);
    let plan = EpochPlan::new(&input, 2, 0, cfg).unwrap();
    assert_eq!(plan.remainder_len(), 11);
    // Rank 1's DataLoader worker 0 hit a corrupt sample in its first batch and replaced it.
    let reader = plan.reader(1, 0).unwrap();
    let failed = reader.emitted().next().unwrap();
    let replacement = expand(reader.reserve())[0];
    let uses = [ReserveUse {
        rank: 1,
        reader: reader.reader,
        used: 1,
    }];
    let state = plan.state(1, &uses).unwrap();
    assert_eq!(state.phases[0].reserve_used, uses);
    let mut seen: HashSet<Sample> = HashSet::new();
    for batches in all_batches(&plan) {
        for &s in batches[0].iter() {
            seen.insert(if s == failed { replacement } else { s });
        }
    }
    // Same configuration: the reader skips its used reserve sample.
    let same = EpochPlan::resume(&input, &state, cfg).unwrap();
    let again = same.reader(1, (reader.reader + 2 - 1) % 2).unwrap();
    assert_eq!(again.reader, reader.reader);
    assert!(!expand(again.reserve()).contains(&replacement));
    // Another configuration: neither the failed sample nor the replacement comes back.
    let other = EpochPlan::resume(&input, &state, PhaseConfig::new(2, 0, 3, 4, true)).unwrap();
    for batches in all_batches(&other) {
        for &s in batches.iter().flatten() {
            assert!(s != failed && s != replacement);
            assert!(seen.insert(s));
        }
    }
    seen.extend(expand(&other.remainder()));
    seen.insert(failed);
    assert_eq!(seen, valid_samples(&input));
}

#[test]
fn resumed_readers_start_inside_a_block() {
    let input = PlanInput::from_counts(&[100]);
    let cfg = PhaseConfig::new(1, 0, 3, 10, true);
    let plan = EpochPlan::new(&input, 0, 0, cfg).unwrap();
    let resumed = EpochPlan::resume(&input, &plan.state(4, &[]).unwrap(), cfg).unwrap();
    let reader = resumed.reader(0, 0).unwrap();
    // 12 samples emitted: block 1, 2 samples in.
    assert_eq!((reader.first_block, reader.skip_emitted), (1, 2));
    assert_eq!(reader.runs().iter().map(Run::len).sum::<u64>(), 99 - 10);
    // 99 samples planned (one global batch of 3 fits 33 times): blocks 1..=8 full, block 9 short.
    assert_eq!(
        reader.block_lengths().collect::<Vec<_>>(),
        [vec![10; 8], vec![9]].concat()
    );
    assert_eq!(reader.num_samples(), 99 - 12);
}

#[test]
fn state_is_small_and_round_trips() {
    let input = uneven_input();
    let plan = EpochPlan::new(&input, 1, 2, PhaseConfig::new(3, 2, 2, 4, true)).unwrap();
    let mid = EpochPlan::resume(
        &input,
        &plan.state(3, &[]).unwrap(),
        PhaseConfig::new(2, 4, 2, 4, true),
    )
    .unwrap();
    let readers = (0..2).flat_map(|r| (0..4).map(move |w| (r, w)));
    let with_reserve = readers
        .map(|(r, w)| mid.reader(r, w).unwrap())
        .find(|p| !p.reserve().is_empty())
        .unwrap();
    let uses = [ReserveUse {
        rank: with_reserve.rank,
        reader: with_reserve.reader,
        used: 1,
    }];
    let state = mid.state(1, &uses).unwrap();
    let json = state.to_json();
    assert!(json.len() < 600, "{json}");
    assert_eq!(EpochState::from_json(json.as_bytes()).unwrap(), state);
    assert_eq!(state.phases.len(), 2);
    assert!(
        json.contains("\"index_fingerprint\":\"000000000000004d\""),
        "{json}"
    );
}

#[test]
fn bad_states_and_configurations_are_refused() {
    let input = uneven_input();
    let cfg = PhaseConfig::new(2, 0, 3, 4, true);
    let plan = EpochPlan::new(&input, 0, 0, cfg).unwrap();
    let state = plan.state(1, &[]).unwrap();
    let other = PlanInput::from_counts(&[5, 5]);
    assert!(matches!(
        EpochPlan::resume(&other, &state, cfg),
        Err(PlanError::OtherDataset { .. })
    ));
    assert!(plan.state(plan.num_batches() + 1, &[]).is_err());
    assert!(plan
        .state(
            0,
            &[ReserveUse {
                rank: 0,
                reader: 0,
                used: 1000
            }]
        )
        .is_err());
    assert!(plan
        .state(
            0,
            &[ReserveUse {
                rank: 5,
                reader: 0,
                used: 1
            }]
        )
        .is_err());
    let mut wrong = state.clone();
    wrong.version = 99;
    assert!(EpochState::from_json(wrong.to_json().as_bytes())
        .unwrap_err()
        .to_string()
        .contains("version 99"));
    assert!(EpochState::from_json(b"{}").is_err());
    for bad in [
        PhaseConfig::new(0, 0, 1, 1, true),
        PhaseConfig::new(1, 0, 0, 1, true),
        PhaseConfig::new(1, 0, 1, 0, true),
    ] {
        assert!(matches!(
            EpochPlan::new(&input, 0, 0, bad),
            Err(PlanError::Config(_))
        ));
    }
    assert!(plan.reader(2, 0).is_err());
    assert!(plan.reader(0, 1).is_err());
    let bad_input = vec![ShardCounts {
        num_samples: 3,
        invalid: vec![3].into(),
    }];
    assert!(PlanInput::new(bad_input, 0).is_err());
}

#[test]
fn the_phase_sequence_keeps_two_runs_per_shard_however_many_samples_are_invalid() {
    // 1,000 shards of 1,000 samples, 1 % invalid: the runs must not split around them
    // (that made a validated index cost ~30 bytes per invalid sample on every rank).
    let shards = (0..1000u64)
        .map(|s| ShardCounts {
            num_samples: 1000,
            invalid: (0..10).map(|i| (s * 7 + i * 97) % 1000).collect(),
        })
        .collect();
    let input = PlanInput::new(shards, 1).unwrap();
    let plan = EpochPlan::new(&input, 3, 0, PhaseConfig::new(4, 2, 16, 100, true)).unwrap();
    assert!(
        plan.sequence.plain_runs() <= 2 * 1000,
        "{}",
        plan.sequence.plain_runs()
    );
    assert_eq!(plan.sequence.len(), 1000 * 990);
    // Readers get only valid ordinals, and the union is every valid sample but the tail.
    let mut seen = HashSet::new();
    for rank in 0..4 {
        for worker in 0..2 {
            for (shard, ordinal) in plan.reader(rank, worker).unwrap().emitted() {
                assert!(input.shards()[shard as usize]
                    .invalid
                    .binary_search(&ordinal)
                    .is_err());
                assert!(seen.insert((shard, ordinal)));
            }
        }
    }
    assert_eq!(seen.len() as u64 + plan.remainder_len(), 990_000);
    // An elastic re-plan from the middle keeps the property too.
    let state = plan.state(plan.num_batches() / 2, &[]).unwrap();
    let resumed = EpochPlan::resume(&input, &state, PhaseConfig::new(3, 2, 16, 100, true)).unwrap();
    assert!(
        resumed.sequence.plain_runs() < 2 * 1000 + 8 * 100,
        "{}",
        resumed.sequence.plain_runs()
    );
}

#[test]
fn an_empty_dataset_plans_nothing() {
    let input = PlanInput::from_counts(&[0, 0]);
    for cfg in configs() {
        let plan = EpochPlan::new(&input, 0, 0, cfg).unwrap();
        assert_eq!(plan.num_batches(), 0);
        assert!(all_batches(&plan).iter().all(Vec::is_empty));
    }
}

#[test]
fn block_permutations_cover_each_block() {
    let input = PlanInput::from_counts(&[37]);
    let plan = EpochPlan::new(&input, 0, 0, PhaseConfig::new(1, 0, 37, 10, true)).unwrap();
    let reader = plan.reader(0, 0).unwrap();
    assert_eq!(
        reader.block_lengths().collect::<Vec<_>>(),
        vec![10, 10, 10, 7]
    );
    let emitted: Vec<Sample> = reader.emitted().collect();
    let read = expand(reader.runs());
    for (b, chunk) in emitted.chunks(10).enumerate() {
        let perm = reader.block_permutation(b as u64);
        let expected: Vec<Sample> = perm.iter().map(|&j| read[b * 10 + j as usize]).collect();
        assert_eq!(chunk, &expected[..]);
    }
}

#[test]
fn shard_assignment_without_index_covers_every_shard() {
    for (shards, w, k) in [
        (10usize, 2u32, 2u32),
        (4, 3, 2),
        (1, 2, 0),
        (7, 1, 0),
        (6, 3, 2),
    ] {
        let cfg = PhaseConfig::new(w, k, 4, 8, true);
        let mut covered: HashMap<(u32, u64), u32> = HashMap::new();
        let mut per_rank = vec![0u64; w as usize];
        for rank in 0..w {
            for worker in 0..cfg.readers_per_rank() {
                let a = assign_shards(shards, 3, 0, cfg, 100, rank, worker).unwrap();
                per_rank[rank as usize] += a.num_batches;
                assert_eq!(a.shuffle.len(), a.num_batches * 4);
                // the first shard is the reader's own share; the rest is its fallback
                let readers = (w * cfg.readers_per_rank()) as usize;
                for &s in a
                    .shards
                    .iter()
                    .take(if shards < readers { 1 } else { usize::MAX })
                {
                    *covered.entry((s, a.offset)).or_default() += 1;
                    if a.stride > 1 {
                        assert!(a.offset < a.stride);
                    }
                }
            }
        }
        assert!(
            per_rank.iter().all(|&n| n == 100 / (w as u64 * 4)),
            "{per_rank:?}"
        );
        assert!(covered.values().all(|&c| c == 1), "{covered:?}");
        let distinct: HashSet<u32> = covered.keys().map(|(s, _)| *s).collect();
        assert_eq!(distinct.len(), shards);
    }
    let cfg = PhaseConfig::new(2, 2, 4, 8, true);
    assert_ne!(
        assign_shards(100, 0, 0, cfg, 800, 0, 0).unwrap().shards,
        assign_shards(100, 0, 1, cfg, 800, 0, 0).unwrap().shards
    );
    assert!(assign_shards(0, 0, 0, cfg, 800, 0, 0).is_err());
}

#[test]
fn many_random_datasets_and_chains() {
    let mut rng = SplitMix64::new(42);
    for trial in 0..40u64 {
        let num_shards = 1 + rng.below(12) as usize;
        let shards: Vec<ShardCounts> = (0..num_shards)
            .map(|_| {
                let n = rng.below(30);
                let invalid = (0..n).filter(|_| rng.below(8) == 0).collect();
                ShardCounts {
                    num_samples: n,
                    invalid,
                }
            })
            .collect();
        let input = PlanInput::new(shards, trial).unwrap();
        let mut random_config = |drop_last: bool| {
            PhaseConfig::new(
                1 + rng.below(4) as u32,
                rng.below(4) as u32,
                1 + rng.below(5),
                1 + rng.below(9),
                drop_last,
            )
        };
        let chain: Vec<(PhaseConfig, u64)> = (0..3)
            .map(|i| (random_config(i > 0 || trial % 2 == 0), 0))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|(c, _)| (c, rng.below(6)))
            .collect();
        run_chain(&input, &chain, trial);
    }
}

// ---- Mixtures ----------------------------------------------------------------------------

/// Three uneven sources (one with invalid samples), weights 0.6 / 0.3 / 0.1.
fn three_sources(epoch_samples: Option<u64>) -> Mixture {
    let a = PlanInput::new(
        [(30u64, vec![3u64, 4]), (7, vec![]), (12, vec![11])]
            .into_iter()
            .map(|(n, bad)| ShardCounts {
                num_samples: n,
                invalid: bad.into(),
            })
            .collect(),
        1,
    )
    .unwrap();
    let b = PlanInput::from_counts(&[5, 9]);
    let c = PlanInput::from_counts(&[3]);
    Mixture::new(
        &[a, b, c],
        &[Share::Weight(0.6), Share::Weight(0.3), Share::Weight(0.1)],
        epoch_samples,
    )
    .unwrap()
}

fn source_of(mixture: &Mixture, shard: u32) -> usize {
    mixture.first_shards().partition_point(|&f| f <= shard) - 1
}

fn multiset(samples: impl IntoIterator<Item = Sample>) -> HashMap<Sample, u64> {
    let mut out = HashMap::new();
    for s in samples {
        *out.entry(s).or_default() += 1;
    }
    out
}

#[test]
fn a_mixture_epoch_yields_each_sources_quota_of_its_stream() {
    let mixture = three_sources(None);
    // 63 valid samples: 37.8 / 18.9 / 6.3 by weight.
    assert_eq!(mixture.quotas(), vec![38, 19, 6]);
    for epoch in [0, 1, 5] {
        let expected = mixture.epoch_samples(4, epoch);
        for cfg in configs().into_iter().filter(|c| c.drop_last) {
            let plan = EpochPlan::mixture(&mixture, 4, epoch, cfg).unwrap();
            let mut got: Vec<Sample> = all_batches(&plan).into_iter().flatten().flatten().collect();
            got.extend(expand(&plan.remainder()));
            assert_eq!(
                multiset(got),
                multiset(expected.iter().flatten().copied()),
                "{cfg:?}"
            );
        }
        // Source 1 (14 samples, 19 a epoch) repeats a sample only after its whole pass.
        let stream: Vec<Sample> = (0..4)
            .flat_map(|e| mixture.epoch_samples(4, e).swap_remove(1))
            .collect();
        for pass in stream.chunks(14) {
            assert_eq!(pass.iter().collect::<HashSet<_>>().len(), pass.len());
        }
    }
}

#[test]
fn every_block_holds_each_source_in_proportion() {
    let parts = [
        PlanInput::from_counts(&[400; 6]),
        PlanInput::from_counts(&[90, 250, 310]),
        PlanInput::from_counts(&[40, 41]),
    ];
    let shares = [Share::Weight(0.6), Share::Weight(0.3), Share::Weight(0.1)];
    let mixture = Mixture::new(&parts, &shares, None).unwrap();
    let weights = [0.6, 0.3, 0.1];
    let cfg = PhaseConfig::new(2, 2, 32, 256, true);
    let plan = EpochPlan::mixture(&mixture, 1, 0, cfg).unwrap();
    let ranks = all_batches(&plan);
    let mut total = [0u64; 3];
    for n in 0..plan.num_batches() as usize {
        let mut counts = [0u64; 3];
        for rank in &ranks {
            for &(shard, _) in &rank[n] {
                counts[source_of(&mixture, shard)] += 1;
            }
        }
        let g = cfg.global_batch() as f64;
        for (i, &w) in weights.iter().enumerate() {
            // A batch is a uniform draw from a block that holds the exact shares: within four
            // binomial standard deviations.
            let sd = (g * w * (1.0 - w)).sqrt();
            assert!(
                (counts[i] as f64 - g * w).abs() <= 4.0 * sd,
                "batch {n}: {counts:?}"
            );
            total[i] += counts[i];
        }
    }
    // Over the epoch, each source within one batch of its share.
    let yielded: u64 = total.iter().sum();
    for (i, &w) in weights.iter().enumerate() {
        assert!((total[i] as f64 - yielded as f64 * w).abs() <= cfg.batch_size as f64);
    }
    // Each reader's blocks hold the shares within 2 samples, and its streams replay `runs()`.
    for rank in 0..2 {
        for worker in 0..2 {
            let reader = plan.reader(rank, worker).unwrap();
            let streams = reader.streams.as_ref().unwrap();
            let mut per_source: Vec<std::vec::IntoIter<Sample>> =
                streams.runs.iter().map(|r| expand(r).into_iter()).collect();
            let mut replay = Vec::new();
            for (b, len) in reader.block_lengths().enumerate() {
                let counts = &streams.block_counts[b * 3..b * 3 + 3];
                assert_eq!(counts.iter().map(|&c| c as u64).sum::<u64>(), len);
                for (i, &c) in counts.iter().enumerate() {
                    assert!(
                        (c as f64 - len as f64 * weights[i]).abs() <= 2.0,
                        "{counts:?}"
                    );
                    replay.extend(per_source[i].by_ref().take(c as usize));
                }
            }
            assert_eq!(replay, expand(reader.runs()));
            assert!(per_source.iter_mut().all(|s| s.next().is_none()));
        }
    }
}

/// A mixture's epoch through a chain of configurations: what was yielded, plus the final
/// remainder, is exactly the epoch's samples (as a multiset: small sources repeat).
fn run_mixture_chain(mixture: &Mixture, chain: &[(PhaseConfig, u64)], seed: u64, used: u64) {
    let mut got: Vec<Sample> = Vec::new();
    let mut plan = EpochPlan::mixture(mixture, seed, 3, chain[0].0).unwrap();
    let mut replaced: Vec<Sample> = Vec::new();
    for (i, &(_, stop)) in chain.iter().enumerate() {
        let stop = stop.min(plan.num_batches());
        for batches in all_batches(&plan) {
            got.extend(batches[..stop as usize].iter().flatten());
        }
        // Rank 0's first reader replaced `used` failed samples from its reserve.
        let reader = plan.reader(0, 0).unwrap();
        let take = if stop > 0 {
            used.min(reader.reserve().iter().map(Run::len).sum())
        } else {
            0
        };
        replaced.extend(expand(reader.reserve()).into_iter().take(take as usize));
        let uses = [ReserveUse {
            rank: 0,
            reader: reader.reader,
            used: take,
        }];
        let json = plan
            .state(stop, &uses[..(take > 0) as usize])
            .unwrap()
            .to_json();
        let state = EpochState::from_json(json.as_bytes()).unwrap();
        let next = chain.get(i + 1).map_or(chain[i].0, |c| c.0);
        plan = EpochPlan::resume_mixture(mixture, &state, next).unwrap();
    }
    for batches in all_batches(&plan) {
        got.extend(batches.into_iter().flatten());
    }
    got.extend(replaced);
    got.extend(expand(&plan.remainder()));
    assert_eq!(
        multiset(got),
        multiset(mixture.epoch_samples(seed, 3).into_iter().flatten()),
        "chain {chain:?}"
    );
}

#[test]
fn mixture_resume_continues_exactly_and_elastic_resume_loses_nothing() {
    let mixture = three_sources(Some(90));
    for cfg in configs().into_iter().filter(|c| c.drop_last) {
        let plan = EpochPlan::mixture(&mixture, 2, 3, cfg).unwrap();
        let full = all_batches(&plan);
        for n in 0..=plan.num_batches() {
            let state = plan.state(n, &[]).unwrap();
            let resumed = EpochPlan::resume_mixture(&mixture, &state, cfg).unwrap();
            for (rank, batches) in all_batches(&resumed).iter().enumerate() {
                assert_eq!(batches[..], full[rank][n as usize..], "{cfg:?} n={n}");
            }
        }
    }
    for (b, c) in [(2, 3), (4, 7), (3, 1), (5, 16)] {
        for stops in [(0, 0), (1, 1), (2, 3), (3, 0), (100, 2)] {
            for used in [0, 1, 2] {
                let chain = [
                    (PhaseConfig::new(2, 2, b, c, true), stops.0),
                    (PhaseConfig::new(3, 2, b, c, true), stops.1),
                    (PhaseConfig::new(1, 0, b + 1, c + 2, true), 0),
                ];
                run_mixture_chain(&mixture, &chain, 11, used);
            }
        }
    }
    // A state of a mixture is refused by another mixture and by a single dataset.
    let plan = EpochPlan::mixture(&mixture, 2, 3, PhaseConfig::new(2, 0, 3, 4, true)).unwrap();
    let state = plan.state(1, &[]).unwrap();
    let other = three_sources(Some(91));
    assert!(EpochPlan::resume_mixture(&other, &state, PhaseConfig::new(2, 0, 3, 4, true)).is_err());
    assert!(
        EpochPlan::resume(mixture.input(), &state, PhaseConfig::new(2, 0, 3, 4, true)).is_err()
    );
}
