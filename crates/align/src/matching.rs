//! The layer-matching table (CE-LSLM eq. 16): each small-model layer takes the large-model
//! layer most similar to it by CKA, among those that reach both the CKA and the RSA threshold.

/// `cka[i][j]`, `rsa[i][j]`: similarity of LLM layer `i` and SLM layer `j`. Returns, per SLM
/// layer, the matched LLM layer (first one on ties) or `None` when no layer passes both.
pub fn match_layers(
    cka: &[Vec<f64>],
    rsa: &[Vec<f64>],
    t_cka: f64,
    t_rsa: f64,
) -> Vec<Option<usize>> {
    let slm_layers = cka.first().map_or(0, |r| r.len());
    (0..slm_layers)
        .map(|j| {
            let mut best: Option<(usize, f64)> = None;
            for (i, row) in cka.iter().enumerate() {
                let passes = row[j] >= t_cka
                    && rsa
                        .get(i)
                        .and_then(|r| r.get(j))
                        .is_some_and(|&r| r >= t_rsa);
                if passes && best.is_none_or(|(_, b)| row[j] > b) {
                    best = Some((i, row[j]));
                }
            }
            best.map(|(i, _)| i)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_layer_passing_both_thresholds() {
        let cka = vec![
            vec![0.9, 0.2, 0.1],
            vec![0.8, 0.7, 0.3],
            vec![0.1, 0.6, 0.4],
        ];
        let rsa = vec![
            vec![0.3, 0.9, 0.9],
            vec![0.9, 0.4, 0.9],
            vec![0.9, 0.9, 0.9],
        ];
        // SLM 0: LLM 0 has the best CKA but fails RSA, so LLM 1. SLM 1: LLM 1 fails RSA,
        // LLM 2 passes. SLM 2: nothing reaches CKA 0.5.
        assert_eq!(
            match_layers(&cka, &rsa, 0.5, 0.5),
            vec![Some(1), Some(2), None]
        );
    }
}
