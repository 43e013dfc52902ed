//! The layer-matching table (CE-LSLM eq. 16): each small-model layer takes the large-model
//! layer most similar to it, if that similarity reaches the threshold.

/// `sim[i][j]`: similarity of LLM layer `i` and SLM layer `j`. Returns, per SLM layer, the
/// matched LLM layer (first one on ties) or `None` below `threshold`.
pub fn match_layers(sim: &[Vec<f64>], threshold: f64) -> Vec<Option<usize>> {
    let slm_layers = sim.first().map_or(0, |r| r.len());
    (0..slm_layers)
        .map(|j| {
            let mut best: Option<(usize, f64)> = None;
            for (i, row) in sim.iter().enumerate() {
                if best.is_none_or(|(_, b)| row[j] > b) {
                    best = Some((i, row[j]));
                }
            }
            best.filter(|(_, s)| *s >= threshold).map(|(i, _)| i)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_layer_above_the_threshold() {
        let sim = vec![
            vec![0.9, 0.2, 0.1],
            vec![0.8, 0.7, 0.3],
            vec![0.1, 0.6, 0.4],
        ];
        assert_eq!(match_layers(&sim, 0.5), vec![Some(0), Some(1), None]);
    }
}
