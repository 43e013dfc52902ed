//! Every LLM layer against every SLM layer, by CKA and by RSA, on the same calibration tokens.

use rayon::prelude::*;
use serde::Serialize;

use crate::calib::Calibration;
use crate::{centered_gram, cka_from_grams, rsa_from_sims, similarity_matrix, AlignError, Result};

#[derive(Debug, Clone, Serialize)]
pub struct Similarity {
    /// `cka[i][j]`: LLM layer `i` vs SLM layer `j`.
    pub cka: Vec<Vec<f64>>,
    pub rsa: Vec<Vec<f64>>,
    pub tokens: usize,
}

/// One layer's centred Gram matrix (for CKA) and cosine-similarity matrix (for RSA).
struct Layer {
    gram: Vec<f64>,
    cosine: Vec<f64>,
}

pub fn compare(llm: &Calibration, slm: &Calibration) -> Result<Similarity> {
    let n = llm.sim_rows;
    if n != slm.sim_rows || n < 3 {
        return Err(AlignError::Calibration(format!(
            "{} and {} sampled tokens: the models must see the same (at least 3) tokens",
            llm.sim_rows, slm.sim_rows
        )));
    }
    let prep = |c: &Calibration| -> Vec<Layer> {
        (0..c.layers.len())
            .into_par_iter()
            .map(|l| {
                let x = c.hidden_f64(l);
                Layer {
                    gram: centered_gram(&x, n),
                    cosine: similarity_matrix(&x, n),
                }
            })
            .collect()
    };
    let (a, b) = (prep(llm), prep(slm));
    let table = |f: &(dyn Fn(&Layer, &Layer) -> f64 + Sync)| {
        a.par_iter()
            .map(|x| b.iter().map(|y| f(x, y)).collect())
            .collect()
    };
    Ok(Similarity {
        cka: table(&|x, y| cka_from_grams(&x.gram, &y.gram)),
        rsa: table(&|x, y| rsa_from_sims(&x.cosine, &y.cosine, n)),
        tokens: n,
    })
}
