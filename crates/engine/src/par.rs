//! Row-wise passes (norms, residual adds, the gated activation) cut over the pool. A batched
//! decode step runs ~10 of them per layer; on the calling thread alone they were a sixth of a
//! batch-32 SmolLM2 step while the other threads waited. Each row is computed by itself, so
//! the cut changes no bit.

use std::sync::Mutex;

/// Below this many values a pass stays on the calling thread (a pool call costs about a
/// microsecond).
const PAR_MIN_FLOATS: usize = 8192;

/// `f(a_rows, b_rows)` over whole `width`-wide rows of `a` and the same rows of `b` (`b`
/// either as long as `a` or empty, then each call gets an empty `b`), in a few tasks when
/// there are many values.
pub(crate) fn rows2(
    a: &mut [f32],
    b: &[f32],
    width: usize,
    f: &(dyn Fn(&mut [f32], &[f32]) + Sync),
) {
    debug_assert!(b.is_empty() || b.len() == a.len());
    let rows = a.len() / width.max(1);
    let tasks = (2 * rayon::current_num_threads()).min(rows);
    if a.len() < PAR_MIN_FLOATS || tasks < 2 {
        return f(a, b);
    }
    let per = rows.div_ceil(tasks) * width;
    let parts: Vec<Mutex<(&mut [f32], &[f32])>> = a
        .chunks_mut(per)
        .enumerate()
        .map(|(i, a)| {
            let b = if b.is_empty() {
                b
            } else {
                &b[i * per..i * per + a.len()]
            };
            Mutex::new((a, b))
        })
        .collect();
    crate::pool::run(parts.len(), &|i| {
        if let Ok(mut p) = parts[i].lock() {
            let (a, b) = &mut *p;
            f(a, b);
        }
    });
}

/// `f(i, item)` for every item, in a few tasks of consecutive items when there are `min` or
/// more.
pub(crate) fn each<T: Send>(items: &mut [T], min: usize, f: &(dyn Fn(usize, &mut T) + Sync)) {
    let tasks = (2 * rayon::current_num_threads()).min(items.len());
    if items.len() < min.max(2) || tasks < 2 {
        return items.iter_mut().enumerate().for_each(|(i, t)| f(i, t));
    }
    let per = items.len().div_ceil(tasks);
    let parts: Vec<Mutex<&mut [T]>> = items.chunks_mut(per).map(Mutex::new).collect();
    crate::pool::run(parts.len(), &|c| {
        if let Ok(mut p) = parts[c].lock() {
            for (i, t) in p.iter_mut().enumerate() {
                f(c * per + i, t);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_cut_whole_and_meet_their_partners() {
        let (rows, width) = (37, 300);
        let b: Vec<f32> = (0..rows * width).map(|i| i as f32).collect();
        let mut a = vec![0f32; rows * width];
        rows2(&mut a, &b, width, &|a, b| {
            assert_eq!(a.len() % width, 0);
            a.copy_from_slice(b);
        });
        assert_eq!(a, b);
        let mut seen = vec![0usize; 50];
        each(&mut seen, 4, &|i, s| *s += i + 1);
        assert!(seen.iter().enumerate().all(|(i, &s)| s == i + 1));
    }
}
