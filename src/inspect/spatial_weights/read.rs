//! Reading each block's W out of the file: the initializer names and shapes the emitter
//! gives it (see the parent module's doc), checked against the recorded configuration
//! before any value is read.

use std::path::Path;

use super::{SpatialWeights, Values};
use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, SpatialForm};
use crate::gmlp::metadata::{parse_config, CONFIG_KEY};
use crate::onnx::proto::{ModelProto, TensorProto};
use crate::onnx::reader::{element_count, metadata_value};
use crate::onnx::values::tensor_f32;

/// The configuration a file built by gmlp-onnx records, checked.
pub fn recorded_config(model: &ModelProto) -> Result<GmlpConfig> {
    let cfg = metadata_value(model, CONFIG_KEY)
        .and_then(parse_config)
        .ok_or_else(|| {
            Error::ForeignModel(format!(
                "no {CONFIG_KEY} metadata: W is found through the configuration `gmlp-onnx build` records, and this file has none"
            ))
        })?;
    cfg.validate()?;
    Ok(cfg)
}

/// Every block's W of `model` (its file at `path`, for external data).
pub fn spatial_weights(model: &ModelProto, path: &Path) -> Result<Vec<SpatialWeights>> {
    let cfg = recorded_config(model)?;
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| Error::Internal("decoded model without graph".into()))?;
    let find = |name: &str| graph.initializer.iter().find(|t| t.name() == name);
    (0..cfg.layers)
        .map(|i| block_weights(&cfg, i, &find, path))
        .collect()
}

/// Block `block`'s W, found by the names and shapes the emitter gives it: a float
/// initializer (dense, window, either Toeplitz form) or the int8 transposed one with its
/// scales.
fn block_weights<'m>(
    cfg: &GmlpConfig,
    block: usize,
    find: &impl Fn(&str) -> Option<&'m TensorProto>,
    path: &Path,
) -> Result<SpatialWeights> {
    let n = cfg.seq_len();
    let mixing = cfg.block.mixing(block);
    let name = format!("blocks.{block}.sgu.spatial.weight");
    let (rows, cols) = match mixing.window {
        Some(w) => (w, 2 * w),
        None => (n, n),
    };
    let mut w = SpatialWeights {
        block,
        heads: cfg.heads,
        rows,
        cols,
        stored: "dense",
        initializer: name.clone(),
        dtype: String::new(),
        causal: cfg.causal,
        window: mixing.window,
        fold: mixing.fold,
        sub: n.div_ceil(mixing.fold.max(1)),
        values: Values::Matrix(Vec::new()),
    };
    if let Some(t) = find(&name) {
        read_float(&mut w, t, cfg, path)?;
        return Ok(w);
    }
    let q_name = format!("{name}.transposed.int8");
    let s_name = format!("{name}.transposed.scale");
    let (Some(q), Some(s)) = (find(&q_name), find(&s_name)) else {
        return Err(bad_model(
            path,
            format!("block {block} has no spatial weight (no initializer {name} or {q_name})"),
        ));
    };
    read_int8(&mut w, (q, q_name), (s, &s_name), n, path)?;
    Ok(w)
}

/// A file whose W is not what its configuration says.
fn bad_model(path: &Path, reason: String) -> Error {
    Error::BadModel {
        path: path.to_path_buf(),
        reason,
    }
}

/// The element count of `t` (`u64::MAX` when it has none).
fn count(t: &TensorProto) -> u64 {
    element_count(t).unwrap_or(u64::MAX)
}

/// Reads `w` from its float initializer `t`: the whole matrix of every head, or the
/// Toeplitz-gather vector of `2n − 1` values per head.
fn read_float(
    w: &mut SpatialWeights,
    t: &TensorProto,
    cfg: &GmlpConfig,
    path: &Path,
) -> Result<()> {
    let (n, heads, rows, cols) = (cfg.seq_len(), w.heads, w.rows, w.cols);
    let matrix = (heads * rows * cols) as u64;
    w.dtype = crate::onnx::dtype::type_name(t.data_type());
    let vector = (heads * (2 * n - 1)) as u64;
    if count(t) == matrix {
        w.stored = match (w.window, cfg.spatial) {
            (Some(_), _) => "window",
            (None, SpatialForm::ToeplitzExpand) => "toeplitz-expand",
            _ => "dense",
        };
        w.values = Values::Matrix(tensor_f32(t, path)?);
    } else if w.window.is_none() && cfg.spatial.is_toeplitz() && count(t) == vector {
        w.stored = "toeplitz-gather";
        w.values = Values::Vector(tensor_f32(t, path)?);
    } else {
        return Err(bad_model(
            path,
            format!(
                "initializer {} holds {:?} values, not the {matrix} of W for {heads} head(s) of [{rows}, {cols}]",
                w.initializer, t.dims
            ),
        ));
    }
    Ok(())
}

/// Reads `w` from the int8 initializer `q` of Wᵀ, named `q_name`, and its per-column
/// scales `s`, named `s_name` (no window: `n` × `n` per head).
fn read_int8(
    w: &mut SpatialWeights,
    (q, q_name): (&TensorProto, String),
    (s, s_name): (&TensorProto, &str),
    n: usize,
    path: &Path,
) -> Result<()> {
    let heads = w.heads;
    let matrix = (heads * w.rows * w.cols) as u64;
    if w.window.is_some() || count(q) != matrix || count(s) != (heads * n) as u64 {
        return Err(bad_model(
            path,
            format!(
                "initializers {q_name} {:?} and {s_name} {:?} are not W for {heads} head(s) of [{n}, {n}]",
                q.dims, s.dims
            ),
        ));
    }
    let (q, scales) = (tensor_f32(q, path)?, tensor_f32(s, path)?);
    // Stored Wᵀ: q[h, j, i] with scale s[h, i] per column i (the output token).
    let mut values = vec![0f32; q.len()];
    for h in 0..heads {
        let (qh, sh) = (&q[h * n * n..(h + 1) * n * n], &scales[h * n..(h + 1) * n]);
        let out = &mut values[h * n * n..(h + 1) * n * n];
        for i in 0..n {
            for j in 0..n {
                out[i * n + j] = qh[j * n + i] * sh[i];
            }
        }
    }
    w.stored = "int8";
    w.initializer = q_name;
    w.dtype = "int8".into();
    w.values = Values::Matrix(values);
    Ok(())
}
