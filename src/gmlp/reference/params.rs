//! The model's logical parameters by name as f64 arrays (a Toeplitz W is its [2n−1]
//! vector), and the ends of a token model.

use ndarray::{Array1, Array2, ArrayD, IxDyn};

use crate::error::{Error, Result};
use crate::gmlp::weights::{ParamSpec, WeightSource};

/// The model's logical parameters by name, as f64 arrays.
pub(super) struct Params<'a> {
    pub(super) specs: Vec<ParamSpec>,
    pub(super) source: &'a dyn WeightSource,
}

impl Params<'_> {
    pub(super) fn get(&self, name: &str) -> Result<ArrayD<f64>> {
        let spec = self
            .specs
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| Error::InvalidConfig(format!("no parameter named {name}")))?;
        let values = self.source.values(spec)?;
        ArrayD::from_shape_vec(IxDyn(&spec.shape), values)
            .map(|a| a.mapv(f64::from))
            .map_err(|e| Error::BadTensor(format!("{name}: {e}")))
    }
    pub(super) fn matrix(&self, name: &str) -> Result<Array2<f64>> {
        self.get(name)?
            .into_dimensionality()
            .map_err(|e| Error::BadTensor(format!("{name}: {e}")))
    }
    pub(super) fn vector(&self, name: &str) -> Result<Array1<f64>> {
        self.get(name)?
            .into_dimensionality()
            .map_err(|e| Error::BadTensor(format!("{name}: {e}")))
    }
}

/// The embedding table [vocab, d] and the output head (weight [d, vocab] — the table
/// transposed when tied, `head.weight` otherwise — and bias [vocab]).
pub(super) fn token_ends(
    p: &Params,
    tied_embedding: bool,
) -> Result<(Array2<f64>, Array2<f64>, Array1<f64>)> {
    let table = p.matrix("embed.weight")?;
    let head = if tied_embedding {
        table.t().to_owned()
    } else {
        p.matrix("head.weight")?
    };
    Ok((table, head, p.vector("head.bias")?))
}
