#[inline(never)]
fn hot(n: u64) -> u64 {
    std::hint::black_box(n) * 3 + 1
}
fn main() {
    let mut s = 0;
    for i in 0..5000 {
        s += hot(i);
    }
    println!("{s}");
}
