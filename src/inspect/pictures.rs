//! `inspect --plot`: pictures of the spatial weights W, the figures the paper draws of a
//! trained gMLP (Liu et al. 2021, §3 and fig. 3): one PNG per block, its gating heads side
//! by side on one colour scale, titled with the block's Toeplitz-ness, and an overview
//! sheet of every block, each panel on its own scale.

use std::path::Path;

use super::spatial_weights::spatial_weights;
use super::spatial_weights::SpatialWeights;
use super::{checked_onnx_path, summarize, ModelSummary};
use crate::error::{Error, Result};
use crate::message::{Phrase, Setting};
use crate::onnx::reader::read_model;
use crate::plot::heatmap::{Matrix, Scale, Sheet};
use crate::plot::number;
use crate::plot::Image;

/// Most panels one sheet shows (heads of a block, or blocks × heads of the overview);
/// the sheet says how many it leaves out.
pub const MAX_PANELS: usize = 64;

/// A Toeplitz-ness score with three decimals, or `n/a`.
fn score(s: Option<f64>) -> String {
    s.map_or("n/a".to_string(), |v| format!("{v:.3}"))
}

/// The panels of `w`'s heads (at most [`MAX_PANELS`]), labelled by `label`, with the
/// entries the model reads marked when it does not read them all.
fn matrices(w: &SpatialWeights, label: impl Fn(usize) -> String) -> Result<Vec<Matrix>> {
    w.check_expandable()?;
    let mask = w.read_mask();
    let read = mask.iter().any(|r| !r).then_some(mask);
    (0..w.heads.min(MAX_PANELS))
        .map(|h| {
            Ok(Matrix {
                label: label(h),
                rows: w.rows,
                cols: w.cols,
                values: w.matrix(h)?,
                read: read.clone(),
            })
        })
        .collect()
}

/// What rows and columns of `w` mean.
fn axes(w: &SpatialWeights) -> String {
    match w.window {
        Some(k) => format!(
            "rows i: a position in its window of {k}; columns j: the previous window (j < {k}), then its own"
        ),
        None if w.fold > 1 => format!(
            "rows i: output position, columns j: input position, within each of the {} interleaved sub-sequences",
            w.fold
        ),
        None => "rows i: output token, columns j: input token (W[i, j] weighs token j into token i)"
            .to_string(),
    }
}

/// Summarizes the model at `path` and writes pictures of its spatial weights into `dir`
/// (see [`pictures`]); the summary lists them.
pub fn inspect_and_plot(path: &Path, dir: &Path) -> Result<ModelSummary> {
    let model = read_model(checked_onnx_path(path)?)?;
    let mut summary = summarize(&model, path);
    let weights = spatial_weights(&model, path).map_err(|e| match e {
        Error::ForeignModel(m) => Error::Setting(
            Phrase::setting(Setting::Plot).then(format!(": {}: {m}", path.display())),
        ),
        other => other,
    })?;
    let sheets = pictures(&weights, path)?;
    summary.plots = crate::plot::write_pngs(dir, &sheets)?;
    Ok(summary)
}

/// The file name of block `i`'s picture, zero-padded to sort in block order.
pub fn block_file(i: usize, blocks: usize) -> String {
    let digits = blocks.saturating_sub(1).max(1).to_string().len();
    format!("block_{i:0digits$}.png")
}

/// The pictures of `weights` (a model's blocks in order, read from `model`): file name and
/// image, the overview last.
pub fn pictures(weights: &[SpatialWeights], model: &Path) -> Result<Vec<(String, Image)>> {
    let name = model.file_name().map_or_else(
        || model.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let mut out = Vec::with_capacity(weights.len() + 1);
    for w in weights {
        let sheet = block_sheet(w, &name)?;
        out.push((block_file(w.block, weights.len()), sheet.render()?));
    }
    let sheet = overview_sheet(weights, &name)?;
    out.push(("overview.png".to_string(), sheet.render()?));
    Ok(out)
}

/// The sheet of one block of the model file `name`: its heads side by side on one scale,
/// under its Toeplitz-ness, what the axes mean and where W is stored.
fn block_sheet(w: &SpatialWeights, name: &str) -> Result<Sheet> {
    let s = w.summary();
    let panels = matrices(w, |h| {
        if w.heads > 1 {
            format!("head {h}: Toeplitz-ness {}", score(s.head_toeplitz_ness[h]))
        } else {
            "W[i, j]".to_string()
        }
    })?;
    let mut lines = vec![
        format!(
            "Toeplitz-ness ||T(W)||² / ||W||² = {} (1: shift-invariant; an i.i.d. random W ~{:.3}); max|W| = {}, mean {}",
            score(s.toeplitz_ness),
            s.random_level,
            number(s.max_abs),
            s.mean.map_or("n/a".into(), number)
        ),
        axes(w),
        format!(
            "{name}: {} ({}), reads {}",
            s.initializer,
            if s.stored == s.dtype {
                s.stored.clone()
            } else {
                format!("{}, {}", s.stored, s.dtype)
            },
            s.reads
        ),
    ];
    if w.heads > MAX_PANELS {
        lines.push(format!("heads 0..{MAX_PANELS} of {} shown", w.heads));
    }
    let (panel_px, columns) = match w.heads {
        1 => (512, 1),
        2..=4 => (320, w.heads),
        _ => (192, 4),
    };
    let shape = if w.heads > 1 {
        format!("{} heads of [{} x {}]", w.heads, w.rows, w.cols)
    } else {
        format!("[{} x {}]", w.rows, w.cols)
    };
    Ok(Sheet {
        title: format!("block {}: spatial weight W {shape}", w.block),
        lines,
        panels,
        columns,
        panel_px,
        scale: Scale::Shared,
        bar_label: "W[i, j]".into(),
    })
}

/// The overview sheet of every block of the model file `name`, each panel on its own
/// scale (the first [`MAX_PANELS`] panels).
fn overview_sheet(weights: &[SpatialWeights], name: &str) -> Result<Sheet> {
    let mut panels = Vec::new();
    let mut total = 0;
    for w in weights {
        total += w.heads;
        if panels.len() >= MAX_PANELS {
            continue;
        }
        let s = w.summary();
        let mut m = matrices(w, |h| {
            if w.heads > 1 {
                format!(
                    "block {} head {h}: {}",
                    w.block,
                    score(s.head_toeplitz_ness[h])
                )
            } else {
                format!("block {}: {}", w.block, score(s.toeplitz_ness))
            }
        })?;
        m.truncate(MAX_PANELS - panels.len());
        panels.extend(m);
    }
    let count = panels.len();
    let columns = ((count as f64).sqrt().ceil() as usize).clamp(1, 8);
    let panel_px = match count {
        0..=16 => 192,
        17..=36 => 128,
        _ => 96,
    };
    let mut lines = vec![
        "panel titles: block (and head) and its Toeplitz-ness ||T(W)||² / ||W||² (1: shift-invariant)".to_string(),
        "each panel on its own scale, ±(its largest |W|); the per-block pictures share one scale per block".to_string(),
    ];
    if count < total {
        lines.push(format!("the first {count} of {total} panels"));
    }
    Ok(Sheet {
        title: format!("{name}: spatial weights W of {} blocks", weights.len()),
        lines,
        panels,
        columns,
        panel_px,
        scale: Scale::PerPanel,
        bar_label: "W / max|W|".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_files_sort_in_block_order() {
        assert_eq!(block_file(0, 1), "block_0.png");
        assert_eq!(block_file(3, 10), "block_3.png");
        assert_eq!(block_file(3, 11), "block_03.png");
        assert_eq!(block_file(99, 100), "block_99.png");
        assert_eq!(block_file(7, 101), "block_007.png");
    }
}
