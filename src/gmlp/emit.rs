//! Emits the gMLP / aMLP network as a [`Graph`] (no protobuf here: only graph-builder calls).
//!
//! Each block (paper eq. 1–4, fig. 1; aMLP fig. 6):
//! ```text
//! h  = LN(x)                       blocks.i/norm
//! z1 = GELU(h·U1 + bU1)            blocks.i/proj_in_z1, blocks.i/gelu_z1
//! z2 = GELU(h·U2 + bU2)            blocks.i/proj_in_z2, blocks.i/gelu_z2
//! g  = W·LN(z2) + b                blocks.i/sgu/norm, blocks.i/sgu/spatial_matmul, .../spatial_bias
//! g  = g + attn(h)                 blocks.i/attn/q, k, v, ...   (aMLP)
//! y  = x + (z1 ⊙ g)·V + bV         blocks.i/sgu/gate, blocks.i/proj_out, blocks.i/residual
//! ```
//! Causal models: W is masked (W[i, j] = 0 for j > i) in the stored weights, and the
//! attention scores get −1e9 above the diagonal before the softmax.
//!
//! The f32 graph is shaped for ONNX Runtime's CPU fusions (measured in BENCHMARKS.md):
//! U's two halves U1 = U[:, :e], U2 = U[:, e:] are two MatMuls (no `Split` of z), each bias
//! `Add` directly follows its MatMul, and GELU is spelled in the pattern `GeluFusion` and
//! `BiasGeluFusion` match (see [`GraphBuilder::gelu`]).

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, Precision, SpatialForm, Task};
use crate::gmlp::toeplitz::{mask_upper, toeplitz_expand, toeplitz_index};
use crate::gmlp::weights::{check_values, param_specs, ParamSpec, WeightSource};
use crate::onnx::builder::GraphBuilder;
use crate::onnx::forms::OpForms;
use crate::onnx::graph::{Dim, ElemType, Graph, TensorData, Value};

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

mod dense;

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

    /// A parameter whose values, produced when the file is written, are checked and then
    /// passed through `post` and stored with dimensions `dims`.
    fn lazy_param(
        &mut self,
        name: &str,
        dims: &[usize],
        post: impl Fn(Vec<f32>) -> Vec<f32> + Send + Sync + 'static,
    ) -> Result<Value> {
        self.lazy_param_as(name, dims, self.cfg.dtype.elem(), post)
    }

    fn lazy_param_as(
        &mut self,
        name: &str,
        dims: &[usize],
        elem: ElemType,
        post: impl Fn(Vec<f32>) -> Vec<f32> + Send + Sync + 'static,
    ) -> Result<Value> {
        let spec = self.spec(name)?;
        let source = self.source.clone();
        let produce = move || {
            let v = source.values(&spec)?;
            check_values(&spec, &v)?;
            Ok(post(v))
        };
        self.g
            .weight_as(name, dims, elem, TensorData::LazyF32(Arc::new(produce)))
    }

    /// A parameter stored as is, in the model's storage type.
    fn param(&mut self, name: &str) -> Result<Value> {
        let dims = self.spec(name)?.shape;
        self.lazy_param(name, &dims, |v| v)
    }

    /// Casts `x` to `to` if it is of another type.
    fn cast_to(&mut self, local: &str, x: &Value, to: ElemType) -> Result<Value> {
        if x.elem == to {
            Ok(x.clone())
        } else {
            self.g.cast(local, x, to)
        }
    }

    /// Leading `[heads]` dimension when the gate has more than one head.
    fn head_dims(&self, rest: &[usize]) -> Vec<usize> {
        let mut dims = rest.to_vec();
        if self.cfg.heads > 1 {
            dims.insert(0, self.cfg.heads);
        }
        dims
    }

    /// The spatial bias b, stored as [n, 1] (or [h, n, 1]) so it broadcasts over channels.
    fn spatial_bias(&mut self, name: &str) -> Result<Value> {
        let dims = self.head_dims(&[self.cfg.seq_len(), 1]);
        self.lazy_param(name, &dims, |v| v)
    }

    /// The spatial weight W as an [n, n] (or [h, n, n]) value in the configured form.
    fn spatial_weight(&mut self, name: &str) -> Result<Value> {
        let n = self.cfg.seq_len();
        let causal = self.cfg.causal;
        let mask_each = move |mut w: Vec<f32>| {
            if causal {
                w.chunks_mut(n * n).for_each(|m| mask_upper(m, n));
            }
            w
        };
        match self.cfg.spatial {
            SpatialForm::Dense => {
                let dims = self.head_dims(&[n, n]);
                self.lazy_param(name, &dims, mask_each)
            }
            SpatialForm::ToeplitzExpand => {
                let dims = self.head_dims(&[n, n]);
                self.lazy_param(name, &dims, move |w| {
                    let full = w
                        .chunks(2 * n - 1)
                        .flat_map(|v| toeplitz_expand(v, n))
                        .collect();
                    mask_each(full)
                })
            }
            SpatialForm::ToeplitzGather => {
                let dims = self.head_dims(&[2 * n - 1]);
                let vector = self.lazy_param(name, &dims, move |mut w| {
                    if causal {
                        // w[k] serves j − i = k − (n − 1); k > n − 1 is above the diagonal.
                        w.chunks_mut(2 * n - 1).for_each(|v| v[n..].fill(0.0));
                    }
                    w
                })?;
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
                let axis = dims.len() - 1;
                self.g
                    .gather("spatial_weight_gather", &vector, &index, axis)
            }
        }
    }

    /// g-mlp-pytorch's token shift of the normalized block input (see
    /// [`GmlpConfig::shift_amounts`]): chunk k of the channels moves by `amounts[k]` tokens
    /// with zero fill; the remaining channels are unchanged.
    fn shift_tokens(&mut self, h: &Value) -> Result<Value> {
        let amounts = self.cfg.shift_amounts();
        let (d, n) = (self.cfg.d_model, self.cfg.seq_len());
        let chunk = d / amounts.len();
        let rest = d - chunk * amounts.len();
        let mut sizes = vec![chunk; amounts.len()];
        if rest > 0 {
            sizes.push(rest);
        }
        let parts = self.g.split("split", h, -1, &sizes)?;
        let mut shifted = Vec::with_capacity(parts.len());
        for (k, part) in parts.iter().enumerate() {
            let a = amounts.get(k).copied().unwrap_or(0);
            let moved = match a.cmp(&0) {
                std::cmp::Ordering::Equal => part.clone(),
                std::cmp::Ordering::Greater => {
                    let a = a as usize;
                    let kept = self.g.slice(&format!("keep_{k}"), part, 1, 0, n - a)?;
                    self.g.pad_axis(&format!("shift_{k}"), &kept, 1, a, 0)?
                }
                std::cmp::Ordering::Less => {
                    let a = a.unsigned_abs() as usize;
                    let kept = self.g.slice(&format!("keep_{k}"), part, 1, a, n)?;
                    self.g.pad_axis(&format!("shift_{k}"), &kept, 1, 0, a)?
                }
            };
            shifted.push(moved);
        }
        let refs: Vec<&Value> = shifted.iter().collect();
        self.g.concat("concat", &refs, -1)
    }

    /// W · LN(z2) + b with one W and b per head: the gate channels are split into
    /// `heads` contiguous groups ([B, n, e] → [B, h, n, e/h]).
    fn spatial_projection(&mut self, z2: &Value, p: &str) -> Result<Value> {
        let name = format!("{p}.sgu.spatial.weight");
        // int8 models quantize W at build time (emit/dense.rs) instead of emitting it.
        let w = match self.cfg.dtype {
            Precision::Int8 => None,
            _ => Some(self.spatial_weight(&name)?),
        };
        let b = self.spatial_bias(&format!("{p}.sgu.spatial.bias"))?;
        let mix = |s: &mut Self, u: &Value| match &w {
            Some(w) => s.g.matmul("spatial_matmul", w, u),
            None => s.spatial_matmul_int8("spatial_matmul", &name, u),
        };
        let heads = self.cfg.heads;
        if heads == 1 {
            let mixed = mix(self, z2)?;
            return self.g.add("spatial_bias", &mixed, &b);
        }
        let (n, e) = (self.cfg.seq_len(), self.cfg.gate_dim());
        let c = e / heads;
        let batch = z2.shape[0].clone();
        let split = self.g.reshape(
            "split_heads",
            z2,
            &[0, n as i64, heads as i64, c as i64],
            vec![
                batch.clone(),
                Dim::Fixed(n),
                Dim::Fixed(heads),
                Dim::Fixed(c),
            ],
        )?;
        let per_head = self.g.transpose("heads_first", &split, &[0, 2, 1, 3])?;
        let mixed = mix(self, &per_head)?;
        let biased = self.g.add("spatial_bias", &mixed, &b)?;
        let back = self.g.transpose("tokens_first", &biased, &[0, 2, 1, 3])?;
        self.g.reshape(
            "merge_heads",
            &back,
            &[0, n as i64, e as i64],
            vec![batch, Dim::Fixed(n), Dim::Fixed(e)],
        )
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
        let quantize = self.cfg.dtype == Precision::Int8;
        self.dense(local, x, weight, bias, None, quantize)
    }

    /// LayerNorm, always computed in f32 (an f16 model casts around it, keeping its
    /// scale and shift in f32).
    fn layer_norm(&mut self, local: &str, x: &Value, prefix: &str, eps: f32) -> Result<Value> {
        let (w, b) = (format!("{prefix}.weight"), format!("{prefix}.bias"));
        let dims = self.spec(&w)?.shape;
        let scale = self.lazy_param_as(&w, &dims, ElemType::F32, |v| v)?;
        let shift = self.lazy_param_as(&b, &dims, ElemType::F32, |v| v)?;
        let x32 = self.cast_to(&format!("{local}_to_f32"), x, ElemType::F32)?;
        let y = self.g.layer_norm(local, &x32, &scale, &shift, eps)?;
        self.cast_to(&format!("{local}_to_f16"), &y, x.elem)
    }

    /// Tiny attention of aMLP (fig. 6): single head of size a on the block's normalized input.
    fn attention(&mut self, p: &str, h: &Value, a: usize) -> Result<Value> {
        // q, k, v from column slices of Wqkv (three MatMuls, no Split).
        let quantize = self.cfg.dtype == Precision::Int8;
        let mut parts = Vec::with_capacity(3);
        for (k, part) in ["q", "k", "v"].into_iter().enumerate() {
            let weight = format!("{p}.attn.qkv.weight");
            let cols = Some((k * a, (k + 1) * a));
            parts.push(self.dense(part, h, &weight, None, cols, quantize)?);
        }
        let elem = parts[0].elem;
        let scale = self
            .g
            .const_float("scale_value", &[], vec![(a as f32).powf(-0.5)], elem)?;
        let q = self.g.mul("q_scale", &parts[0], &scale)?;
        let kt = self.g.transpose("k_transpose", &parts[1], &[0, 2, 1])?;
        let scores = self.g.matmul("scores", &q, &kt)?;
        // Mask and softmax in f32 (an f16 model casts around them).
        let mut scores = self.cast_to("scores_to_f32", &scores, ElemType::F32)?;
        if self.cfg.causal {
            let mask = self.causal_mask()?;
            scores = self.g.add("causal_mask", &scores, &mask)?;
        }
        let probs = self.g.softmax("softmax", &scores, -1)?;
        let probs = self.cast_to("probs_to_f16", &probs, elem)?;
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
        let mut h = self.layer_norm("norm", x, &format!("{p}.norm"), eps)?;
        if self.cfg.shift_tokens > 0 {
            h = self.scoped("token_shift", |s| s.shift_tokens(&h))?;
        }
        let quantize = self.cfg.dtype == Precision::Int8;
        let mut halves = Vec::with_capacity(2);
        for (k, cols) in [(0, e), (e, 2 * e)].into_iter().enumerate() {
            let z = self.dense(
                &format!("proj_in_z{}", k + 1),
                &h,
                &format!("{p}.proj_in.weight"),
                Some(&format!("{p}.proj_in.bias")),
                Some(cols),
                quantize,
            )?;
            halves.push(self.g.gelu(&format!("gelu_z{}", k + 1), &z)?);
        }
        let attn = match self.cfg.attn_dim {
            Some(a) => Some(self.scoped("attn", |s| s.attention(&p, &h, a))?),
            None => None,
        };
        let gated = self.scoped("sgu", |s| {
            let z2 = s.layer_norm("norm", &halves[1], &format!("{p}.sgu.norm"), sgu_eps)?;
            let mut gate = s.spatial_projection(&z2, &p)?;
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
                let x = self.scoped("embed", |s| s.g.gather("gather", &table, &ids, 0))?;
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
                let elem = self.cfg.dtype.elem();
                let x = self.scoped("stem", |s| {
                    let pixels = s.cast_to("input_to_f16", &pixels, elem)?;
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
        let tied = matches!(
            self.cfg.task,
            Task::Tokens {
                tied_embedding: true,
                ..
            }
        );
        self.scoped(HEAD_SCOPE, |s| match (&s.cfg.task, embedding) {
            (Task::Tokens { .. }, Some(table)) if tied => {
                // Output projection tied to the embedding: logits = h · Eᵀ + bias.
                let logits = if s.cfg.dtype == Precision::Int8 {
                    s.tied_head_int8("vocab_projection", h, "embed.weight")?
                } else {
                    let table_t = s.g.transpose("embed_transpose", &table, &[1, 0])?;
                    s.g.matmul("vocab_projection", h, &table_t)?
                };
                let bias = s.param("head.bias")?;
                s.g.add("vocab_bias", &logits, &bias)
            }
            (Task::Tokens { .. }, _) => {
                s.linear("vocab_projection", h, "head.weight", Some("head.bias"))
            }
            (Task::Vision { .. }, _) => {
                let pooled = s.g.mean("token_mean", h, &[1], false)?;
                // The small classifier stays f32 in int8 models too.
                s.dense(
                    "classifier",
                    &pooled,
                    "head.weight",
                    Some("head.bias"),
                    None,
                    false,
                )
            }
        })
    }
}

/// Emits the whole network for `cfg` at `opset`, with parameter values taken from
/// `source` when the graph is written.
pub fn build_graph(cfg: &GmlpConfig, source: Arc<dyn WeightSource>, opset: i64) -> Result<Graph> {
    build_graph_with_forms(cfg, source, opset, OpForms::default())
}

/// [`build_graph`] with the operations spelled in `forms` (a `--target` profile's).
pub fn build_graph_with_forms(
    cfg: &GmlpConfig,
    source: Arc<dyn WeightSource>,
    opset: i64,
    forms: OpForms,
) -> Result<Graph> {
    cfg.validate()?;
    let specs = param_specs(cfg)
        .into_iter()
        .map(|s| (s.name.clone(), s))
        .collect();
    let mut em = Emitter {
        g: GraphBuilder::with_forms(opset, forms)?,
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
    let logits = em.cast_to("logits_to_f32", &logits, ElemType::F32)?;
    let logits = em.g.rename(&logits, LOGITS)?;
    Ok(em.g.finish("gmlp", vec![logits]))
}
