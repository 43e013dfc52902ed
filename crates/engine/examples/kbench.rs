//! Scratch kernel micro-benchmark (not committed).
use edgeprompt_engine::kernels::{Format, QMatrix};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let f = match args[1].as_str() {
        "q4_0" => Format::Q4_0,
        "q4_1" => Format::Q4_1,
        "q5_0" => Format::Q5_0,
        "q8_0" => Format::Q8_0,
        "q4k" => Format::Q4K,
        _ => Format::Q6K,
    };
    let n: usize = args[2].parse().unwrap();
    let k: usize = args[3].parse().unwrap();
    let m: usize = args[4].parse().unwrap();
    let iters: usize = args[5].parse().unwrap();
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build_global();
    let bb = f.block_bytes();
    let nblk = n * k / f.block_values();
    let mut data = vec![0u8; nblk * bb];
    let mut s = 1u64;
    for x in data.iter_mut() {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
        *x = (s >> 33) as u8;
    }
    for b in 0..nblk {
        let at = if f == Format::Q6K { 208 } else { 0 };
        data[b * bb + at] = 0;
        data[b * bb + at + 1] = 0x1c;
    }
    let w = QMatrix::new(f, n, k, data).unwrap();
    let x: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let _ = w.matmul(&x, m);
    let t = Instant::now();
    for _ in 0..iters {
        std::hint::black_box(w.matmul(&x, m));
    }
    let dt = t.elapsed().as_secs_f64() / iters as f64;
    println!(
        "{:?} n={n} k={k} m={m}: {:.3} ms/call, {:.1} GB/s weights, {:.1} GMAC/s",
        f,
        dt * 1e3,
        w.bytes() as f64 / dt / 1e9,
        (n * k * m) as f64 / dt / 1e9
    );
}
