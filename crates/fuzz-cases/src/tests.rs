//! Each case on its seeds and on a fixed sequence of mutations of them, as libFuzzer's first
//! seconds would try (bits and bytes changed, runs inserted, cut, repeated, seeds spliced):
//! the crash check CI runs, where `scripts/fuzz.sh` searches for hours.

use super::CASES;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Mutated inputs per case, unless its time runs out first (rendering a result file is the
/// slowest case: a few milliseconds an input).
const MUTATIONS: usize = 4000;
const TIME_PER_CASE: Duration = Duration::from_secs(3);

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// The seeds of a case (`fuzz/seeds/NAME/*`, in name order), after the empty input.
fn seeds(name: &str) -> Vec<Vec<u8>> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(fuzz_dir().join("seeds").join(name)) {
        Ok(dir) => dir.map(|e| e.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    std::iter::once(Vec::new())
        .chain(files.iter().map(|f| std::fs::read(f).unwrap()))
        .collect()
}

/// xorshift64*: a fixed sequence for every run, so a failure comes back on the next run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Bytes that change how text formats and length fields read.
const INTERESTING: &[u8] = b"\0\x01\x7f\x80\xff\n\r\t \"\\{}[]:,.-+e0159=#'";

/// One to four of libFuzzer's kinds of change, on `input`, with `others` to splice from.
fn mutate(rng: &mut Rng, input: &[u8], others: &[Vec<u8>]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(v.len() + 1);
        match rng.below(9) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next() as u8;
            }
            2 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            3 => {
                let n = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                v.splice(at..at, bytes);
            }
            4 => {
                let end = (at + 1 + rng.below(16)).min(v.len());
                v.drain(at.min(end)..end);
            }
            5 => v.truncate(at),
            6 if !v.is_empty() => {
                // A run of the input repeated in place (a length or a list grown).
                let start = rng.below(v.len());
                let end = (start + 1 + rng.below(32)).min(v.len());
                let run = v[start..end].to_vec();
                v.splice(at..at, run);
            }
            7 => {
                // The tail of another seed from some point on.
                let other = &others[rng.below(others.len())];
                let from = rng.below(other.len() + 1);
                v.truncate(at);
                v.extend_from_slice(&other[from..]);
            }
            _ => {
                let b = INTERESTING[rng.below(INTERESTING.len())];
                v.insert(at, b);
            }
        }
    }
    v
}

#[test]
fn every_fuzz_target_has_a_case_and_every_case_a_target() {
    let mut targets: Vec<String> = std::fs::read_dir(fuzz_dir().join("fuzz_targets"))
        .expect("fuzz/fuzz_targets")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    targets.sort();
    let cases: Vec<&str> = CASES.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        targets, cases,
        "fuzz/fuzz_targets/ and CASES, in name order"
    );
    // Each target calls its case, so that what libFuzzer searches is what CI checks.
    for name in &targets {
        let path = fuzz_dir().join("fuzz_targets").join(format!("{name}.rs"));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains(&format!("bloatlab_fuzz_cases::{name}")),
            "{} does not call bloatlab_fuzz_cases::{name}",
            path.display()
        );
    }
}

#[test]
fn every_case_holds_on_its_seeds_and_mutations_of_them() {
    let mut failures = Vec::new();
    for &(name, case) in CASES {
        let seeds = seeds(name);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ name.len() as u64);
        let t0 = Instant::now();
        let mut tried = 0;
        for i in 0..seeds.len() + MUTATIONS {
            if i >= seeds.len() && t0.elapsed() > TIME_PER_CASE {
                break;
            }
            let input = match seeds.get(i) {
                Some(s) => s.clone(),
                None => {
                    let base = &seeds[rng.below(seeds.len())];
                    mutate(&mut rng, base, &seeds)
                }
            };
            tried += 1;
            if let Err(e) = catch_unwind(AssertUnwindSafe(|| case(&input))) {
                let why = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                // The input whole, for libFuzzer to replay and for a regression test.
                let out = std::env::temp_dir().join(format!("bloatlab-fuzz-case-{name}-{i}"));
                std::fs::write(&out, &input).unwrap();
                failures.push(format!("{name}: input {i} ({}): {why}", out.display()));
                break;
            }
        }
        println!(
            "{name}: {} seeds, {tried} inputs in {:.2} s",
            seeds.len() - 1,
            t0.elapsed().as_secs_f64()
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
