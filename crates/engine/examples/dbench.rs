//! Scratch decode breakdown (not committed).
use edgeprompt_engine::{Model, Sequence};
use std::time::Instant;
fn main() {
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build_global();
    let m = Model::load(std::env::args().nth(1).unwrap()).unwrap();
    let ids: Vec<u32> = (0..600u32).map(|i| 100 + (i * 37) % 5000).collect();
    let mut seq = Sequence::new(&m);
    seq.prefill(&m, &ids[..512]).unwrap();
    let n = 64;
    let t = Instant::now();
    for i in 0..n {
        seq.prefill(&m, &ids[512 + i..513 + i]).unwrap();
    }
    let step = t.elapsed().as_secs_f64() / n as f64;
    let x = vec![0.1f32; m.cfg.n_embd];
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(m.logits(&x).unwrap());
    }
    let head = t.elapsed().as_secs_f64() / n as f64;
    let (bytes, _) = m.traffic();
    println!(
        "step {:.2} ms, head {:.2} ms, layers {:.2} ms; {:.1} GB/s overall",
        step * 1e3,
        head * 1e3,
        (step - head) * 1e3,
        bytes as f64 / step / 1e9
    );
}
