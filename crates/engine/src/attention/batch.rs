//! Attention for a whole batch: views on shared prefixes and private keys, queries grouped by
//! KV head and prefix, the shared prefix read tile by tile for every query that sees it.

use half::f16;

use super::dispatch;
use super::State;
use crate::kv::{LayerKv, LayerSpan};

/// What one sequence's new rows attend to in one layer.
#[derive(Clone, Copy)]
pub struct KvView<'a> {
    /// Shared read-only prefix; every new row sees all of it.
    pub prefix: Option<&'a LayerKv>,
    /// The sequence's own KV, already holding the new rows' K/V at its end.
    pub private: &'a LayerKv,
    /// How many new rows (the last ones in `private` but `after`).
    pub rows: usize,
    /// Rows of `private` after the new ones, not seen by them (a layer that attends with an
    /// earlier layer's KV, which holds its whole pass already: the pass's later pieces).
    pub after: usize,
}

/// A `KvView` with the sequence's kept positions (a conversation's earlier turns, read-only)
/// between its prefix and its private KV: each new row sees all of them, after the prefix.
#[derive(Clone, Copy)]
pub struct KeptView<'a> {
    pub view: KvView<'a>,
    pub kept: Option<LayerSpan<'a>>,
}

impl KeptView<'_> {
    /// Positions before the private KV.
    fn before(&self) -> usize {
        self.kept
            .map(|k| k.end())
            .or(self.view.prefix.map(|p| p.end()))
            .unwrap_or(0)
    }
}

/// Keys converted and read per tile, for every query that shares them.
const PREFIX_TILE: usize = 64;

/// One query row and head of the batch.
#[derive(Clone, Copy)]
struct Query {
    view: usize,
    /// Row in the batch.
    row: usize,
    /// Row within its view.
    t: usize,
    head: usize,
}

/// Attention for a whole batch (`q`: `[rows, n_head * head_dim]`, RoPE applied; views in row
/// order) into `out` (same shape). Row `t` of a view sees its whole prefix and private keys
/// `0..=before + t`; with a sliding `window`, only the keys of the last `window` positions
/// up to its own.
///
/// Queries whose sequences share one prefix buffer read it together, one tile of keys at a
/// time, so a batch reads the shared prefix from memory once per step instead of once per
/// sequence (RelayAttention's idea, done as tiling on a CPU). Every query still consumes keys
/// one by one in position order with its own state, so each row's output is bitwise what it
/// would be alone.
pub fn attend_batch(
    q: &[f32],
    views: &[KvView],
    n_head: usize,
    head_dim: usize,
    window: Option<usize>,
    out: &mut [f32],
) {
    let scale = 1.0 / (head_dim as f32).sqrt();
    attend_batch_scaled(
        q,
        views,
        n_head,
        head_dim,
        window,
        Scores { scale, cap: None },
        out,
    )
}

/// How a family scores a query against a key: `q.k * scale`, soft-capped to `cap * tanh(s /
/// cap)` when `cap` is given (Gemma 2; the scalar path then runs on every ISA).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scores {
    pub scale: f32,
    pub cap: Option<f32>,
}

/// `attend_batch` with a family's own `Scores`.
pub fn attend_batch_scaled(
    q: &[f32],
    views: &[KvView],
    n_head: usize,
    head_dim: usize,
    window: Option<usize>,
    scores: Scores,
    out: &mut [f32],
) {
    let views: Vec<KeptView> = views
        .iter()
        .map(|&view| KeptView { view, kept: None })
        .collect();
    attend_batch_kept(q, &views, n_head, head_dim, window, scores, out)
}

/// `attend_batch_scaled` for sequences with kept positions: a view's kept keys come after the
/// shared prefix and before its private keys (a query takes every key in position order, so
/// the bits are those of one private segment holding them all).
pub fn attend_batch_kept(
    q: &[f32],
    views: &[KeptView],
    n_head: usize,
    head_dim: usize,
    window: Option<usize>,
    scores: Scores,
    out: &mut [f32],
) {
    // Group queries by (what prefix they read, KV head): a group reads the same keys. A view
    // takes a block of consecutive group ids, one per KV head, shared with the views before it
    // on the same prefix; each group's queries lie together in `flat`, in the order they came.
    // (A linear search of the groups per query cost a batch-32 layer ~10 µs.)
    let mut prefixes: Vec<(*const LayerKv, usize)> = Vec::new();
    let mut heads: Vec<(usize, usize)> = Vec::new();
    let bases: Vec<usize> = views
        .iter()
        .map(|v| {
            let v = &v.view;
            let kv_heads = v.private.n_kv_head;
            let known = v.prefix.and_then(|p| {
                prefixes
                    .iter()
                    .find(|(q, _)| std::ptr::eq(*q, p))
                    .map(|&(_, base)| base)
            });
            let base = known.unwrap_or_else(|| {
                heads.extend((0..kv_heads).map(|h| (h, 0)));
                heads.len() - kv_heads
            });
            if let (Some(p), None) = (v.prefix, known) {
                prefixes.push((p, base));
            }
            for h in &mut heads[base..base + kv_heads] {
                h.1 += v.rows * (n_head / kv_heads);
            }
            base
        })
        .collect();
    let mut next: Vec<usize> = heads
        .iter()
        .scan(0, |at, &(_, n)| {
            *at += n;
            Some(*at - n)
        })
        .collect();
    let bounds: Vec<(usize, usize)> = next
        .iter()
        .zip(&heads)
        .map(|(&a, h)| (a, a + h.1))
        .collect();
    let empty = Query {
        view: 0,
        row: 0,
        t: 0,
        head: 0,
    };
    let mut flat = vec![empty; bounds.last().map_or(0, |b| b.1)];
    let mut row = 0;
    for (vi, (v, &base)) in views.iter().map(|v| &v.view).zip(&bases).enumerate() {
        let group = n_head / v.private.n_kv_head;
        for t in 0..v.rows {
            for head in 0..n_head {
                let id = base + head / group;
                flat[next[id]] = Query {
                    view: vi,
                    row,
                    t,
                    head,
                };
                next[id] += 1;
            }
            row += 1;
        }
    }
    let groups: Vec<(usize, &[Query])> = bounds
        .iter()
        .zip(&heads)
        .map(|(&(a, b), h)| (h.0, &flat[a..b]))
        .collect();
    let total = flat.len();
    let threads = rayon::current_num_threads();
    // Enough tasks to balance two threads (a batch of 32 on SmolLM2 made nine equal tasks:
    // one thread idle for a ninth of the call), at least two queries each so that a lone
    // sequence's heads still read their keys in lockstep; each group cut in equal chunks,
    // of whole eights once they are longer than four.
    let per_task = total.div_ceil(8 * threads).clamp(2, 32);
    let lanes = if cfg!(target_arch = "x86_64") && crate::kernels::LEVEL.wide() {
        16
    } else {
        8
    };
    // A group of eight or fewer (a lone sequence's heads of one KV head) stays whole when
    // there are groups enough for the threads: each task converts and reads the keys once.
    let whole_small = groups.len() >= threads;
    // Large groups on AVX-512 go in tasks of up to `most` sixteens, which convert each block
    // of keys once for all of them; the tasks shrink as the sixteens left run out (guided
    // self-scheduling: big ones first, single sixteens last to even out the threads).
    let most = dispatch::sixteens(head_dim);
    let large = |qs: &[Query]| most > 1 && qs.len() >= 2 * lanes;
    let mut left: usize = groups
        .iter()
        .filter(|(_, qs)| large(qs))
        .map(|(_, qs)| qs.len().div_ceil(lanes))
        .sum();
    let mut tasks: Vec<(usize, &[Query])> = Vec::new();
    for &(g, qs) in &groups {
        if large(qs) {
            let mut at = 0;
            while at < qs.len() {
                let k = left.div_ceil(2 * threads).clamp(1, most);
                let end = qs.len().min(at + k * lanes);
                tasks.push((g, &qs[at..end]));
                left = left.saturating_sub((end - at).div_ceil(lanes));
                at = end;
            }
            continue;
        }
        let cuts = if whole_small && qs.len() <= 8 {
            1
        } else {
            qs.len().div_ceil(per_task)
        };
        let mut size = qs.len().div_ceil(cuts);
        if size > 4 {
            // Whole eights (sixteens on AVX-512) run the across-queries kernels.
            size = size.next_multiple_of(lanes);
        }
        tasks.extend(qs.chunks(size.max(1)).map(|c| (g, c)));
    }
    assert_eq!(out.len(), row * n_head * head_dim, "attention output shape");
    let dst = Outputs(out.as_mut_ptr(), out.len());
    crate::pool::run(tasks.len(), &|i| {
        let (g, qs) = tasks[i];
        attend_task(q, views, g, qs, n_head, head_dim, window, scores, &dst);
    });
}

/// `attend_batch`'s output, written by its tasks in place: each (row, head) belongs to one
/// query of one task, so no two tasks write the same values.
struct Outputs(*mut f32, usize);

// SAFETY: tasks write disjoint ranges (above); the pool returns before `out` is used again.
unsafe impl Sync for Outputs {}

impl Outputs {
    /// The `n` values at `at`.
    ///
    /// # Safety
    /// No other task uses them while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slot(&self, at: usize, n: usize) -> &mut [f32] {
        assert!(at + n <= self.1, "attention output out of range");
        std::slice::from_raw_parts_mut(self.0.add(at), n)
    }
}

/// Queries `qs`, all on KV head `g` and the same prefix: the shared prefix tile by tile for
/// all of them, then each one's kept and private keys; each query's output into `out`.
#[allow(clippy::too_many_arguments)]
fn attend_task(
    q: &[f32],
    views: &[KeptView],
    g: usize,
    qs: &[Query],
    n_head: usize,
    head_dim: usize,
    window: Option<usize>,
    scores: Scores,
    out: &Outputs,
) {
    let scale = scores.scale;
    let width = n_head * head_dim;
    let mut rows = ROWS.with(|c| c.take());
    rows.clear();
    rows.resize(qs.len() * head_dim, 0.0);
    for (query, r) in qs.iter().zip(rows.chunks_exact_mut(head_dim)) {
        let at = query.row * width + query.head * head_dim;
        for (x, &y) in r.iter_mut().zip(&q[at..at + head_dim]) {
            *x = y * scale;
        }
    }
    // This thread's states from its last task, reset: fresh ones zeroed a whole
    // `MAX_HEAD_DIM` accumulator each (a batch-32 step's tasks zeroed ~9 MB).
    let mut states = STATES.with(|c| c.take());
    states.truncate(qs.len());
    states.iter_mut().for_each(|s| s.reset(head_dim));
    states.resize_with(qs.len(), || State::new(head_dim));
    // Absolute position of each query, and the first position its window lets it see.
    let pos = |x: &Query| {
        let v = &views[x.view];
        v.before() + v.view.private.len() - v.view.after - v.view.rows + x.t
    };
    let first = |x: &Query| window.map_or(0, |w| (pos(x) + 1).saturating_sub(w));
    if let Some(p) = qs.first().and_then(|f| views[f.view].view.prefix) {
        let ranges: Vec<(usize, usize)> = qs
            .iter()
            .map(|x| (first(x).saturating_sub(p.start()).min(p.len()), p.len()))
            .collect();
        attend_keys(
            &mut states,
            &rows,
            p.keys(g),
            p.values(g),
            &ranges,
            scores.cap,
        );
    }
    // Queries are in row order, so each view's queries are one run; they share its keys, each
    // up to its causal limit.
    let mut at = 0;
    while at < qs.len() {
        let kept = views[qs[at].view].kept;
        let base = views[qs[at].view].before();
        let view = &views[qs[at].view].view;
        let end = at
            + qs[at..]
                .iter()
                .take_while(|x| x.view == qs[at].view)
                .count();
        if let Some(k) = kept {
            let ranges: Vec<(usize, usize)> = qs[at..end]
                .iter()
                .map(|x| (first(x).saturating_sub(k.start()).min(k.len()), k.len()))
                .collect();
            attend_keys(
                &mut states[at..end],
                &rows[at * head_dim..end * head_dim],
                k.keys(g),
                k.values(g),
                &ranges,
                scores.cap,
            );
        }
        let ranges: Vec<(usize, usize)> = qs[at..end]
            .iter()
            .map(|x| {
                let hi = view.private.len() - view.after - view.rows + x.t + 1;
                (first(x).saturating_sub(base).min(hi), hi)
            })
            .collect();
        attend_keys(
            &mut states[at..end],
            &rows[at * head_dim..end * head_dim],
            view.private.keys(g),
            view.private.values(g),
            &ranges,
            scores.cap,
        );
        at = end;
    }
    for (st, x) in states.iter().zip(qs) {
        // SAFETY: this task's query alone writes its (row, head) (`Outputs`).
        st.write_output(unsafe { out.slot((x.row * n_head + x.head) * head_dim, head_dim) });
    }
    STATES.with(|c| c.set(states));
    ROWS.with(|c| c.set(rows));
}

thread_local! {
    /// Running states kept from one attention task to the next on this thread.
    static STATES: std::cell::Cell<Vec<State>> = const { std::cell::Cell::new(Vec::new()) };
    /// The task's scaled queries, kept likewise.
    static ROWS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// `tiles`' f32 copies of a tile's keys and values, kept likewise (not allocated and
    /// zeroed per call).
    static TILES: std::cell::Cell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::Cell::new((Vec::new(), Vec::new())) };
}

/// `attend_shared`, or with capped scores the scalar path query by query.
fn attend_keys(
    states: &mut [State],
    rows: &[f32],
    keys: &[f16],
    values: &[f16],
    ranges: &[(usize, usize)],
    cap: Option<f32>,
) {
    let Some(cap) = cap else {
        return attend_shared(states, rows, keys, values, ranges);
    };
    let Some(d) = states.first().map(|s| s.dim) else {
        return;
    };
    for ((st, r), &(lo, hi)) in states.iter_mut().zip(rows.chunks_exact(d)).zip(ranges) {
        if hi > lo {
            let (k, v) = (&keys[lo * d..hi * d], &values[lo * d..hi * d]);
            super::scalar::attend_capped(st, r, k, v, hi - lo, Some(cap));
        }
    }
}

/// Each query `i` (state `states[i]`, row `i` of `rows`) consumes keys `ranges[i]` (`lo..hi`):
/// the span every query of the leading sixteens sees in one pass (AVX-512), the rest tile by
/// tile, a tile converted from f16 once and read by every query that sees it.
pub(super) fn attend_shared(
    states: &mut [State],
    rows: &[f32],
    keys: &[f16],
    values: &[f16],
    ranges: &[(usize, usize)],
) {
    let Some(d) = states.first().map(|s| s.dim) else {
        return;
    };
    if !dispatch::fast(&states[0]) {
        for ((st, r), &(lo, hi)) in states.iter_mut().zip(rows.chunks_exact(d)).zip(ranges) {
            if hi > lo {
                let kv = dispatch::Kv::F16(&keys[lo * d..], &values[lo * d..]);
                dispatch::attend_one(st, r, kv, hi - lo);
            }
        }
        return;
    }
    // On AVX-512 the leading sixteens take the keys they all see (a causal chunk's earlier
    // rows, a shared prefix) in one `attend16` pass: a pass per tile transposed their queries
    // and states in and out each time, a third of `attend16` in a Gemma 3 prefill. Each
    // query's keys before that span go first and the rest after, so every query still takes
    // its keys in order.
    let lead = dispatch::wide_lead(states);
    let span = (
        ranges[..lead].iter().map(|r| r.0).max().unwrap_or(0),
        ranges[..lead].iter().map(|r| r.1).min().unwrap_or(0),
    );
    if lead == 0 || span.1 <= span.0 {
        return tiles(states, rows, keys, values, ranges);
    }
    let heads: Vec<(usize, usize)> = ranges[..lead].iter().map(|r| (r.0, span.0)).collect();
    tiles(&mut states[..lead], &rows[..lead * d], keys, values, &heads);
    dispatch::sixteens_over(&mut states[..lead], &rows[..lead * d], keys, values, span);
    let rest: Vec<(usize, usize)> = ranges
        .iter()
        .enumerate()
        .map(|(i, &(lo, hi))| if i < lead { (span.1, hi) } else { (lo, hi) })
        .collect();
    tiles(states, rows, keys, values, &rest);
}

/// `attend_shared`'s tile loop: each query `i` consumes keys `ranges[i]`, tile by tile; the
/// queries that see the same keys of a tile take them in one call.
fn tiles(
    states: &mut [State],
    rows: &[f32],
    keys: &[f16],
    values: &[f16],
    ranges: &[(usize, usize)],
) {
    let Some(d) = states.first().map(|s| s.dim) else {
        return;
    };
    // Few queries convert f16 in registers; more share one f32 copy of each tile, except on
    // AVX-512, where `attend_few` converts blocks of sixteen keys into L1 itself.
    let convert = states.len() > 4 && !dispatch::converts_blocks();
    let (mut kt, mut vt) = TILES.with(|c| c.take());
    if convert {
        // Every value a call reads is written by `widen` first.
        kt.resize(PREFIX_TILE * d, 0.0);
        vt.resize(PREFIX_TILE * d, 0.0);
    }
    // Without a copy a tile only groups the calls: one per run of queries is enough.
    let tile = if convert { PREFIX_TILE } else { usize::MAX };
    let longest = ranges.iter().map(|r| r.1).max().unwrap_or(0);
    let mut j0 = ranges.iter().map(|r| r.0).min().unwrap_or(0);
    while j0 < longest {
        let n = tile.min(longest - j0);
        let (k, v) = (&keys[j0 * d..(j0 + n) * d], &values[j0 * d..(j0 + n) * d]);
        if convert {
            dispatch::widen(k, &mut kt[..n * d]);
            dispatch::widen(v, &mut vt[..n * d]);
        }
        // The part of this tile query `i` sees, as offsets into the tile.
        let part = |i: usize| {
            let (lo, hi) = ranges[i];
            let a = lo.clamp(j0, j0 + n) - j0;
            (a, (hi.clamp(j0, j0 + n) - j0).max(a))
        };
        // Runs of queries that take the same keys of this tile go together.
        let mut i = 0;
        while i < states.len() {
            let (a, b) = part(i);
            let end = i
                + 1
                + (i + 1..states.len())
                    .take_while(|&e| part(e) == (a, b))
                    .count();
            if b > a {
                let kv = if convert {
                    dispatch::Kv::F32(&kt[a * d..], &vt[a * d..])
                } else {
                    dispatch::Kv::F16(&k[a * d..], &v[a * d..])
                };
                dispatch::attend_many(&mut states[i..end], &rows[i * d..end * d], kv, b - a);
            }
            i = end;
        }
        j0 += n;
    }
    TILES.with(|c| c.set((kt, vt)));
}
