//! Offers in Rust through the rtprof-offer crate: by function pointer
//! (`offer!`, which checks the signatures) and by the name reports print
//! (`dot::dot_plain`). Each implementation counts its own calls.
//! Prints the offers' answers, then "ready"; reads lines: "counts" prints
//! the calls per implementation, "quit" ends.
use std::io::BufRead;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

static PLAIN: AtomicU64 = AtomicU64::new(0);
static CHUNKS: AtomicU64 = AtomicU64::new(0);
static REVERSED: AtomicU64 = AtomicU64::new(0);
static STOP: AtomicBool = AtomicBool::new(false);

#[inline(never)]
fn dot_plain(a: &[u64], b: &[u64]) -> u64 {
    PLAIN.fetch_add(1, Relaxed);
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[inline(never)]
fn dot_chunks(a: &[u64], b: &[u64]) -> u64 {
    CHUNKS.fetch_add(1, Relaxed);
    a.chunks(4)
        .zip(b.chunks(4))
        .map(|(x, y)| x.iter().zip(y).map(|(p, q)| p * q).sum::<u64>())
        .sum()
}

#[inline(never)]
fn dot_reversed(a: &[u64], b: &[u64]) -> u64 {
    REVERSED.fetch_add(1, Relaxed);
    a.iter().rev().zip(b.iter().rev()).map(|(x, y)| x * y).sum()
}

fn counts() {
    println!(
        "plain {} chunks {} reversed {}",
        PLAIN.load(Relaxed),
        CHUNKS.load(Relaxed),
        REVERSED.load(Relaxed)
    );
}

fn main() {
    println!("offer chunks {:?}", rtprof_offer::offer!(dot_plain, dot_chunks, "chunks"));
    // SAFETY: dot_reversed has dot_plain's signature.
    let named = unsafe {
        rtprof_offer::offer_named(
            "dot::dot_plain",
            dot_reversed as fn(&[u64], &[u64]) -> u64 as *const (),
            "reversed",
        )
    };
    println!("offer reversed {named:?}");
    println!("ready");
    let worker = std::thread::spawn(|| {
        let a: Vec<u64> = (0..32).collect();
        let b: Vec<u64> = (0..32).map(|x| x + 1).collect();
        let want: u64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        let mut bad = 0;
        while !STOP.load(Relaxed) {
            if dot_plain(std::hint::black_box(&a), std::hint::black_box(&b)) != want {
                bad += 1;
            }
        }
        if bad > 0 {
            println!("wrong results: {bad}");
        }
    });
    for line in std::io::stdin().lock().lines() {
        match line.unwrap().as_str() {
            "counts" => counts(),
            "quit" => break,
            _ => {}
        }
    }
    STOP.store(true, Relaxed);
    worker.join().unwrap();
    counts();
}
