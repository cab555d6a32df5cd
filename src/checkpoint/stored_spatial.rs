//! Spatial weights as checkpoints store them, converted to the configured form.

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::gmlp::config::GmlpConfig;
use crate::gmlp::toeplitz::{toeplitz_expand, toeplitz_fit};
use crate::message::{Phrase, Setting};

/// The stored form of one layer's spatial weight W (one matrix per gating head).
#[derive(Clone, Debug, PartialEq)]
pub enum StoredSpatial {
    /// Dense matrices `[n, n]` or `[h, n, n]` (timm `gate.proj.weight`, g-mlp-pytorch
    /// `sgu.weight`, native dense).
    Dense(String),
    /// Toeplitz vectors `[2n − 1]` or `[h, 2n − 1]` with `W[i, j] = w[j − i + n − 1]` (native).
    Toeplitz(String),
    /// g-mlp-pytorch `circulant_matrix=True`: `w [h, n]`, `pos_x [h, n]`, `pos_y [h, n]`,
    /// `W[i, j] = w[n − 1 − (i − j)] · pos_x[i] · pos_y[j]` for j ≤ i, else 0.
    Circulant {
        /// `sgu.weight`.
        weight: String,
        /// `sgu.circulant_pos_x`.
        pos_x: String,
        /// `sgu.circulant_pos_y`.
        pos_y: String,
    },
}

impl StoredSpatial {
    /// Checkpoint tensors this weight is made from.
    pub fn keys(&self) -> Vec<String> {
        match self {
            StoredSpatial::Dense(k) | StoredSpatial::Toeplitz(k) => vec![k.clone()],
            StoredSpatial::Circulant {
                weight,
                pos_x,
                pos_y,
            } => vec![weight.clone(), pos_x.clone(), pos_y.clone()],
        }
    }

    /// Dense matrices, heads × n × n, row-major.
    fn dense(&self, ck: &Checkpoint, n: usize, heads: usize) -> Result<Vec<f32>> {
        match self {
            StoredSpatial::Dense(k) => ck.f32(k),
            StoredSpatial::Toeplitz(k) => Ok(ck
                .f32(k)?
                .chunks(2 * n - 1)
                .flat_map(|w| toeplitz_expand(w, n))
                .collect()),
            StoredSpatial::Circulant {
                weight,
                pos_x,
                pos_y,
            } => {
                let (w, px, py) = (ck.f32(weight)?, ck.f32(pos_x)?, ck.f32(pos_y)?);
                let mut out = vec![0f32; heads * n * n];
                for h in 0..heads {
                    let (w, px, py) = (&w[h * n..][..n], &px[h * n..][..n], &py[h * n..][..n]);
                    for i in 0..n {
                        for j in 0..=i {
                            out[(h * n + i) * n + j] = w[n - 1 - (i - j)] * px[i] * py[j];
                        }
                    }
                }
                Ok(out)
            }
        }
    }

    /// The values of the native parameter `name` for `cfg`: dense matrices for the dense
    /// forms, Toeplitz vectors for the Toeplitz forms (a dense W is accepted as Toeplitz
    /// only within `tolerance` × max|W|; entries above the diagonal are ignored for causal
    /// models, which mask them).
    pub fn values(
        &self,
        ck: &Checkpoint,
        cfg: &GmlpConfig,
        name: &str,
        tolerance: f32,
    ) -> Result<Vec<f32>> {
        let (n, heads) = (cfg.seq_len(), cfg.heads);
        if !cfg.spatial.is_toeplitz() {
            return self.dense(ck, n, heads);
        }
        if let StoredSpatial::Toeplitz(k) = self {
            return ck.f32(k);
        }
        let dense = self.dense(ck, n, heads)?;
        let mut out = Vec::with_capacity(heads * (2 * n - 1));
        for (h, w) in dense.chunks(n * n).enumerate() {
            let (vector, deviation, scale) = toeplitz_fit(w, n, cfg.causal);
            if f64::from(deviation) > f64::from(tolerance) * f64::from(scale) {
                let head = if heads > 1 {
                    format!(" head {h}")
                } else {
                    String::new()
                };
                return Err(Error::Setting(
                    Phrase::text(format!(
                        "{name}{head} ({}) is not Toeplitz: its entries differ from their diagonal's mean by up to {deviation:.3e} \
                         ({:.2e} of max|W| = {scale:.3e}; tolerance {tolerance:e}); emit it with ",
                        self.keys()[0],
                        deviation / scale.max(f32::MIN_POSITIVE)
                    ))
                    .and(Setting::Spatial)
                    .then(" dense"),
                ));
            }
            out.extend(vector);
        }
        Ok(out)
    }
}
