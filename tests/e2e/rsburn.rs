// A small Rust program for test_e2e's Rust test: two functions of one body burned at 3:1
// for SECONDS (default 2), built twice by CMake with rustc: legacy mangling
// (_ZN6rsburn9hot_three17h<hash>E) and v0 (_RNv...6rsburn9hot_three).
use std::time::{Duration, Instant};

#[inline(never)]
fn hot_three(n: u64) -> u64 {
    let mut y = 0u64;
    for i in 0..3 * n {
        y = (y.wrapping_mul(31) + i) % 1000003;
    }
    y
}

#[inline(never)]
fn hot_one(n: u64) -> u64 {
    let mut y = 0u64;
    for i in 0..n {
        y = (y.wrapping_mul(31) + i) % 1000003;
    }
    y
}

fn main() {
    let secs: f64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut s = 0u64;
    while Instant::now() < end {
        s = s.wrapping_add(hot_three(100000) + hot_one(100000));
    }
    println!("{}", s);
}
