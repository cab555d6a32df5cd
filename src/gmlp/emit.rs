//! Emits the gMLP / aMLP network as a [`Graph`] (no protobuf here: only graph-builder calls).
//!
//! Each block (paper eq. 1–4, fig. 1; aMLP fig. 6):
//! ```text
//! h  = LN(x)                       blocks.i/norm
//! z  = GELU(h·U + bU)              blocks.i/proj_in, blocks.i/gelu
//! z1, z2 = split(z)                blocks.i/split
//! g  = W·LN(z2) + b                blocks.i/sgu/norm, blocks.i/sgu/spatial_matmul, .../spatial_bias
//! g  = g + attn(h)                 blocks.i/attn/...   (aMLP)
//! y  = x + (z1 ⊙ g)·V + bV         blocks.i/sgu/gate, blocks.i/proj_out, blocks.i/residual
//! ```
//! Causal models: W is masked (W[i, j] = 0 for j > i) in the stored weights, and the
//! attention scores get −1e9 above the diagonal before the softmax.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, SpatialForm, Task};
use crate::gmlp::weights::{
    check_values, param_specs, toeplitz_expand, toeplitz_index, ParamSpec, WeightSource,
};
use crate::graph::{Dim, ElemType, Graph, GraphBuilder, TensorData, Value};

/// Name of the token-model input.
pub const INPUT_IDS: &str = "input_ids";
/// Name of the vision-model input.
pub const PIXEL_VALUES: &str = "pixel_values";
/// Name of the output of every model.
pub const LOGITS: &str = "logits";
/// Name of the symbolic batch dimension.
pub const BATCH: &str = "batch";
/// Node-name scope of the output head; the paper's FLOP counts leave it out.
pub const HEAD_SCOPE: &str = "head";
/// Value added to masked attention scores in causal models.
pub const MASK_VALUE: f32 = -1e9;

/// Zeroes the strictly upper triangle (j > i) of a row-major [n, n] matrix.
fn mask_upper(w: &mut [f32], n: usize) {
    for i in 0..n {
        w[i * n + i + 1..(i + 1) * n].fill(0.0);
    }
}

struct Emitter {
    g: GraphBuilder,
    cfg: GmlpConfig,
    specs: HashMap<String, ParamSpec>,
    source: Arc<dyn WeightSource>,
    toeplitz_index: Option<Value>,
    causal_mask: Option<Value>,
}

impl Emitter {
    fn spec(&self, name: &str) -> Result<ParamSpec> {
        self.specs
            .get(name)
            .cloned()
            .ok_or_else(|| Error::InvalidConfig(format!("no parameter named {name}")))
    }

    /// A parameter stored as is (its values are produced when the file is written).
    fn param(&mut self, name: &str) -> Result<Value> {
        let spec = self.spec(name)?;
        let source = self.source.clone();
        let dims = spec.shape.clone();
        let produce = move || {
            let v = source.values(&spec)?;
            check_values(&spec, &v)?;
            Ok(v)
        };
        self.g
            .weight(name, &dims, TensorData::LazyF32(Arc::new(produce)))
    }

    /// The spatial bias b [n] stored as [n, 1] so it broadcasts over channels.
    fn spatial_bias(&mut self, name: &str) -> Result<Value> {
        let spec = self.spec(name)?;
        let source = self.source.clone();
        let n = spec.len();
        let produce = move || {
            let v = source.values(&spec)?;
            check_values(&spec, &v)?;
            Ok(v)
        };
        self.g
            .weight(name, &[n, 1], TensorData::LazyF32(Arc::new(produce)))
    }

    /// The spatial weight W as an [n, n] value in the configured form.
    fn spatial_weight(&mut self, name: &str) -> Result<Value> {
        let spec = self.spec(name)?;
        let n = self.cfg.seq_len();
        let causal = self.cfg.causal;
        let source = self.source.clone();
        match self.cfg.spatial {
            SpatialForm::Dense => {
                let produce = move || {
                    let mut w = source.values(&spec)?;
                    check_values(&spec, &w)?;
                    if causal {
                        mask_upper(&mut w, n);
                    }
                    Ok(w)
                };
                self.g
                    .weight(name, &[n, n], TensorData::LazyF32(Arc::new(produce)))
            }
            SpatialForm::ToeplitzExpand => {
                let produce = move || {
                    let w = source.values(&spec)?;
                    check_values(&spec, &w)?;
                    let mut full = toeplitz_expand(&w, n);
                    if causal {
                        mask_upper(&mut full, n);
                    }
                    Ok(full)
                };
                self.g
                    .weight(name, &[n, n], TensorData::LazyF32(Arc::new(produce)))
            }
            SpatialForm::ToeplitzGather => {
                let produce = move || {
                    let mut w = source.values(&spec)?;
                    check_values(&spec, &w)?;
                    if causal {
                        // w[k] serves j − i = k − (n − 1); k > n − 1 is above the diagonal.
                        w[n..].fill(0.0);
                    }
                    Ok(w)
                };
                let vector =
                    self.g
                        .weight(name, &[2 * n - 1], TensorData::LazyF32(Arc::new(produce)))?;
                let index = match &self.toeplitz_index {
                    Some(v) => v.clone(),
                    None => {
                        let v = self.g.scoped("shared", |g| {
                            g.const_i64("toeplitz_index", &[n, n], toeplitz_index(n))
                        })?;
                        self.toeplitz_index = Some(v.clone());
                        v
                    }
                };
                self.g.gather("spatial_weight_gather", &vector, &index)
            }
        }
    }

    fn causal_mask(&mut self) -> Result<Value> {
        if let Some(v) = &self.causal_mask {
            return Ok(v.clone());
        }
        let n = self.cfg.seq_len();
        let mut mask = vec![0f32; n * n];
        for i in 0..n {
            mask[i * n + i + 1..(i + 1) * n].fill(MASK_VALUE);
        }
        let v = self
            .g
            .scoped("shared", |g| g.const_f32("causal_mask", &[n, n], mask))?;
        self.causal_mask = Some(v.clone());
        Ok(v)
    }

    fn linear(
        &mut self,
        local: &str,
        x: &Value,
        weight: &str,
        bias: Option<&str>,
    ) -> Result<Value> {
        let w = self.param(weight)?;
        let y = self.g.matmul(local, x, &w)?;
        match bias {
            Some(b) => {
                let b = self.param(b)?;
                self.g.add(&format!("{local}_bias"), &y, &b)
            }
            None => Ok(y),
        }
    }

    fn layer_norm(&mut self, local: &str, x: &Value, prefix: &str, eps: f32) -> Result<Value> {
        let scale = self.param(&format!("{prefix}.weight"))?;
        let shift = self.param(&format!("{prefix}.bias"))?;
        self.g.layer_norm(local, x, &scale, &shift, eps)
    }

    /// Tiny attention of aMLP (fig. 6): single head of size a on the block's normalized input.
    fn attention(&mut self, p: &str, h: &Value, a: usize) -> Result<Value> {
        let qkv = self.linear("qkv", h, &format!("{p}.attn.qkv.weight"), None)?;
        let parts = self.g.split("split_qkv", &qkv, -1, &[a, a, a])?;
        let scale = self
            .g
            .const_f32("scale_value", &[], vec![(a as f32).powf(-0.5)])?;
        let q = self.g.mul("q_scale", &parts[0], &scale)?;
        let kt = self.g.transpose("k_transpose", &parts[1], &[0, 2, 1])?;
        let mut scores = self.g.matmul("scores", &q, &kt)?;
        if self.cfg.causal {
            let mask = self.causal_mask()?;
            scores = self.g.add("causal_mask", &scores, &mask)?;
        }
        let probs = self.g.softmax("softmax", &scores, -1)?;
        let context = self.g.matmul("context", &probs, &parts[2])?;
        self.linear(
            "out",
            &context,
            &format!("{p}.attn.out.weight"),
            Some(&format!("{p}.attn.out.bias")),
        )
    }

    fn block(&mut self, i: usize, x: &Value) -> Result<Value> {
        let p = format!("blocks.{i}");
        let e = self.cfg.gate_dim();
        let (eps, sgu_eps) = (self.cfg.norm_eps, self.cfg.sgu_norm_eps);
        let h = self.layer_norm("norm", x, &format!("{p}.norm"), eps)?;
        let z = self.linear(
            "proj_in",
            &h,
            &format!("{p}.proj_in.weight"),
            Some(&format!("{p}.proj_in.bias")),
        )?;
        let z = self.g.gelu("gelu", &z)?;
        let halves = self.g.split("split", &z, -1, &[e, e])?;
        let attn = match self.cfg.attn_dim {
            Some(a) => Some(self.scoped("attn", |s| s.attention(&p, &h, a))?),
            None => None,
        };
        let gated = self.scoped("sgu", |s| {
            let z2 = s.layer_norm("norm", &halves[1], &format!("{p}.sgu.norm"), sgu_eps)?;
            let w = s.spatial_weight(&format!("{p}.sgu.spatial.weight"))?;
            let mixed = s.g.matmul("spatial_matmul", &w, &z2)?;
            let b = s.spatial_bias(&format!("{p}.sgu.spatial.bias"))?;
            let mut gate = s.g.add("spatial_bias", &mixed, &b)?;
            if let Some(attn) = &attn {
                gate = s.g.add("attn_add", &gate, attn)?;
            }
            s.g.mul("gate", &halves[0], &gate)
        })?;
        let y = self.linear(
            "proj_out",
            &gated,
            &format!("{p}.proj_out.weight"),
            Some(&format!("{p}.proj_out.bias")),
        )?;
        self.g.add("residual", x, &y)
    }

    fn scoped<T>(&mut self, name: &str, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        self.g.push_scope(name);
        let out = f(self);
        self.g.pop_scope();
        out
    }

    fn embed(&mut self) -> Result<(Value, Option<Value>)> {
        let batch = Dim::Symbol(BATCH.into());
        match self.cfg.task.clone() {
            Task::Tokens { seq_len, .. } => {
                let ids =
                    self.g
                        .input(INPUT_IDS, ElemType::I64, vec![batch, Dim::Fixed(seq_len)])?;
                let table = self.param("embed.weight")?;
                let x = self.scoped("embed", |s| s.g.gather("gather", &table, &ids))?;
                Ok((x, Some(table)))
            }
            Task::Vision {
                image_size,
                patch_size,
                in_chans,
                ..
            } => {
                let pixels = self.g.input(
                    PIXEL_VALUES,
                    ElemType::F32,
                    vec![
                        batch.clone(),
                        Dim::Fixed(in_chans),
                        Dim::Fixed(image_size),
                        Dim::Fixed(image_size),
                    ],
                )?;
                let (d, n) = (self.cfg.d_model, self.cfg.seq_len());
                let w = self.param("stem.weight")?;
                let b = self.param("stem.bias")?;
                let x = self.scoped("stem", |s| {
                    let fmap =
                        s.g.conv2d("patch_conv", &pixels, &w, &b, patch_size, patch_size)?;
                    // [B, d, h, w] -> [B, d, n] -> [B, n, d]: tokens in row-major patch order.
                    let flat = s.g.reshape(
                        "flatten",
                        &fmap,
                        &[0, d as i64, -1],
                        vec![batch, Dim::Fixed(d), Dim::Fixed(n)],
                    )?;
                    s.g.transpose("to_tokens", &flat, &[0, 2, 1])
                })?;
                Ok((x, None))
            }
        }
    }

    fn head(&mut self, h: &Value, embedding: Option<Value>) -> Result<Value> {
        self.scoped(HEAD_SCOPE, |s| match embedding {
            Some(table) => {
                // Output projection tied to the embedding: logits = h · Eᵀ + bias.
                let table_t = s.g.transpose("embed_transpose", &table, &[1, 0])?;
                let logits = s.g.matmul("vocab_projection", h, &table_t)?;
                let bias = s.param("head.bias")?;
                s.g.add("vocab_bias", &logits, &bias)
            }
            None => {
                let pooled = s.g.reduce_mean("token_mean", h, &[1])?;
                s.linear("classifier", &pooled, "head.weight", Some("head.bias"))
            }
        })
    }
}

/// Emits the whole network for `cfg` at `opset`, with parameter values taken from
/// `source` when the graph is written.
pub fn build_graph(cfg: &GmlpConfig, source: Arc<dyn WeightSource>, opset: i64) -> Result<Graph> {
    cfg.validate()?;
    let specs = param_specs(cfg)
        .into_iter()
        .map(|s| (s.name.clone(), s))
        .collect();
    let mut em = Emitter {
        g: GraphBuilder::new(opset)?,
        cfg: cfg.clone(),
        specs,
        source,
        toeplitz_index: None,
        causal_mask: None,
    };
    let (mut x, embedding) = em.embed()?;
    for i in 0..cfg.layers {
        x = em.scoped(&format!("blocks.{i}"), |s| s.block(i, &x))?;
    }
    let h = em.layer_norm("final_norm", &x, "norm", cfg.norm_eps)?;
    let logits = em.head(&h, embedding)?;
    let logits = em.g.rename(&logits, LOGITS)?;
    Ok(em.g.finish("gmlp", vec![logits]))
}
