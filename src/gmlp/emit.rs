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
//!
//! Causal token models may be emitted with a variable length or with state
//! ([`SequenceMode`], SPEC §6): the new positions P..P+T−1 (P = `past_sequence`, 0
//! without state; T = `sequence`) read rows P..P+T−1 and columns 0..P+T−1 of W and
//! b[P..P+T−1], gathered by a computed row index (which also makes a run past n fail
//! instead of wrapping around); the Toeplitz gather form builds only those rows of its
//! index table, `idx[t][s] = s − (P + t) + n − 1`.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, Precision, SpatialForm, Task};
use crate::gmlp::decoding::{
    block_state, SequenceMode, PAST_SEQUENCE, PAST_SHIFT_SEQUENCE, PRESENT_SHIFT_SEQUENCE,
    SEQUENCE, TOTAL_SEQUENCE,
};
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
    mode: SequenceMode,
    /// Row positions and lengths of a variable-length or with-past graph.
    positions: Option<Positions>,
    /// `past_*` graph inputs, by name (with-past graphs).
    past: HashMap<String, Value>,
    /// `present_*` values in output order (with-past graphs).
    present: Vec<(String, Value)>,
}

/// The run-time positions of a variable-length graph, computed once and shared by blocks.
struct Positions {
    /// Positions P..P+T−1 of the new tokens, i64 [sequence].
    rows: Value,
    /// P + T as an i64 [1] (the end of a column Slice).
    total: Value,
    /// Symbol of P + T.
    total_dim: Dim,
    /// Toeplitz index rows `idx[t][s] = s − (P + t) + n − 1`, i64 [sequence, total]
    /// (gather form only, made on first use).
    toeplitz_index: Option<Value>,
    /// The causal mask's rows P..P+T−1, columns 0..P+T−1 (aMLP, made on first use).
    mask: Option<Value>,
    /// The scalar P + T (for the Toeplitz column range).
    total_scalar: Value,
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

    /// The token shift's channel chunks of `h` (`Split` on the last axis; chunk k moves by
    /// `amounts[k]` tokens, a remainder chunk, if any, stays) and the amounts.
    fn shift_chunks(&mut self, h: &Value) -> Result<(Vec<i64>, Vec<Value>)> {
        let amounts = self.cfg.shift_amounts();
        let d = self.cfg.d_model;
        let chunk = d / amounts.len();
        let rest = d - chunk * amounts.len();
        let mut sizes = vec![chunk; amounts.len()];
        if rest > 0 {
            sizes.push(rest);
        }
        let parts = self.g.split("split", h, -1, &sizes)?;
        Ok((amounts, parts))
    }

    /// g-mlp-pytorch's token shift of the normalized block input (see
    /// [`GmlpConfig::shift_amounts`]): chunk k of the channels moves by `amounts[k]` tokens
    /// with zero fill; the remaining channels are unchanged. `i` is the block (its state
    /// in a with-past graph).
    fn shift_tokens(&mut self, h: &Value, i: usize) -> Result<Value> {
        match self.mode {
            SequenceMode::Fixed => {}
            SequenceMode::Variable => return self.shift_tokens_variable(h),
            SequenceMode::WithPast => return self.shift_tokens_with_past(h, i),
        }
        let n = self.cfg.seq_len();
        let (amounts, parts) = self.shift_chunks(h)?;
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
    fn spatial_projection(&mut self, z2: &Value, p: &str, i: usize) -> Result<Value> {
        if self.mode != SequenceMode::Fixed {
            return self.spatial_projection_rows(z2, p, i);
        }
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
    fn attention(&mut self, p: &str, h: &Value, a: usize, i: usize) -> Result<Value> {
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
        let (keys, values) = if self.mode == SequenceMode::WithPast {
            (
                self.with_past(&format!("past_key.{i}"), "key", &parts[1])?,
                self.with_past(&format!("past_value.{i}"), "value", &parts[2])?,
            )
        } else {
            (parts[1].clone(), parts[2].clone())
        };
        let kt = self.g.transpose("k_transpose", &keys, &[0, 2, 1])?;
        let scores = self.g.matmul("scores", &q, &kt)?;
        // Mask and softmax in f32 (an f16 model casts around them).
        let mut scores = self.cast_to("scores_to_f32", &scores, ElemType::F32)?;
        if self.cfg.causal {
            let mask = if self.mode == SequenceMode::Fixed {
                self.causal_mask()?
            } else {
                self.mask_rows()?
            };
            scores = self.g.add("causal_mask", &scores, &mask)?;
        }
        let probs = self.g.softmax("softmax", &scores, -1)?;
        let probs = self.cast_to("probs_to_f16", &probs, elem)?;
        let context = self.g.matmul("context", &probs, &values)?;
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
            h = self.scoped("token_shift", |s| s.shift_tokens(&h, i))?;
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
            Some(a) => Some(self.scoped("attn", |s| s.attention(&p, &h, a, i))?),
            None => None,
        };
        let gated = self.scoped("sgu", |s| {
            let z2 = s.layer_norm("norm", &halves[1], &format!("{p}.sgu.norm"), sgu_eps)?;
            let mut gate = s.spatial_projection(&z2, &p, i)?;
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
                if self.mode != SequenceMode::Fixed {
                    return self.embed_variable();
                }
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

/// Variable length and state (SPEC §6).
impl Emitter {
    /// `input_ids` [batch, sequence] (and the `past_*` inputs), the embedding, and the
    /// shared row positions P..P+T−1.
    fn embed_variable(&mut self) -> Result<(Value, Option<Value>)> {
        let batch = Dim::Symbol(BATCH.into());
        let seq = Dim::Symbol(SEQUENCE.into());
        let ids = self
            .g
            .input(INPUT_IDS, ElemType::I64, vec![batch.clone(), seq.clone()])?;
        if self.mode == SequenceMode::WithPast {
            let past = Dim::Symbol(PAST_SEQUENCE.into());
            for i in 0..self.cfg.layers {
                for state in block_state(&self.cfg, i) {
                    let rows = match state.window {
                        Some(_) => Dim::Symbol(PAST_SHIFT_SEQUENCE.into()),
                        None => past.clone(),
                    };
                    let shape = vec![batch.clone(), rows, Dim::Fixed(state.width)];
                    let v = self.g.input(&state.past, ElemType::F32, shape)?;
                    self.past.insert(state.past.clone(), v);
                }
            }
        }
        let table = self.param("embed.weight")?;
        let x = self.scoped("embed", |s| s.g.gather("gather", &table, &ids, 0))?;
        let first_past = self.past.get("past_sgu.0").cloned();
        let positions = self.g.scoped("positions", |g| {
            let zero = g.const_i64("zero", &[], vec![0])?;
            let one = g.const_i64("one", &[], vec![1])?;
            let ids_len = g.shape_of("sequence_shape", &ids, 1, 2)?;
            let new = g.gather("sequence", &ids_len, &zero, 0)?;
            let (start, total_dim) = match &first_past {
                Some(past) => {
                    let past_len = g.shape_of("past_shape", past, 1, 2)?;
                    let start = g.gather("past_sequence", &past_len, &zero, 0)?;
                    (start, Dim::Symbol(TOTAL_SEQUENCE.into()))
                }
                None => (zero.clone(), seq.clone()),
            };
            let total_scalar = g.add("total", &start, &new)?;
            let rows = g.range("rows", &start, &total_scalar, &one, seq.clone())?;
            let total = g.reshape("total_1d", &total_scalar, &[1], vec![Dim::Fixed(1)])?;
            Ok(Positions {
                rows,
                total,
                total_dim,
                toeplitz_index: None,
                mask: None,
                total_scalar,
            })
        })?;
        self.positions = Some(positions);
        Ok((x, Some(table)))
    }

    fn positions(&self) -> Result<&Positions> {
        self.positions
            .as_ref()
            .ok_or_else(|| Error::Internal("positions used before the embedding".into()))
    }

    /// Columns 0..P+T−1 of `x` (last axis) for rows already gathered.
    fn first_columns(&mut self, local: &str, x: &Value) -> Result<Value> {
        let pos = self.positions()?;
        let (total, total_dim) = (pos.total.clone(), pos.total_dim.clone());
        let zero = self.g.const_i64(&format!("{local}_start"), &[1], vec![0])?;
        let last = x
            .shape
            .len()
            .checked_sub(1)
            .ok_or_else(|| Error::Internal(format!("{local}: columns of a scalar")))?;
        let mut shape = x.shape.clone();
        shape[last] = total_dim;
        // A non-negative axis: candle-onnx 0.11 misreads Slice's negative axes.
        self.g
            .slice_dynamic(local, x, &zero, &total, &[last as i64], shape)
    }

    /// Rows P..P+T−1 of `x` along `axis` (fails at run time past n).
    fn rows_of(&mut self, local: &str, x: &Value, axis: usize) -> Result<Value> {
        let rows = self.positions()?.rows.clone();
        self.g.gather(local, x, &rows, axis)
    }

    /// The shared index rows `idx[t][s] = s − (P + t) + n − 1` of the Toeplitz gather form.
    fn toeplitz_index_rows(&mut self) -> Result<Value> {
        if let Some(v) = &self.positions()?.toeplitz_index {
            return Ok(v.clone());
        }
        let n = self.cfg.seq_len();
        let pos = self.positions()?;
        let (rows, total_scalar, total_dim) = (
            pos.rows.clone(),
            pos.total_scalar.clone(),
            pos.total_dim.clone(),
        );
        let seq = rows.shape[0].clone();
        let v = self.g.scoped("shared", |g| {
            let zero = g.const_i64("toeplitz_zero", &[], vec![0])?;
            let one = g.const_i64("toeplitz_one", &[], vec![1])?;
            let cols = g.range("toeplitz_columns", &zero, &total_scalar, &one, total_dim)?;
            let rows_col = g.reshape("toeplitz_rows", &rows, &[-1, 1], vec![seq, Dim::Fixed(1)])?;
            let offset = g.sub("toeplitz_offset", &cols, &rows_col)?;
            let diagonal = g.const_i64("toeplitz_diagonal", &[], vec![n as i64 - 1])?;
            g.add("toeplitz_index", &offset, &diagonal)
        })?;
        if let Some(pos) = self.positions.as_mut() {
            pos.toeplitz_index = Some(v.clone());
        }
        Ok(v)
    }

    /// The causal mask for the new rows: [sequence, total], shared by the blocks.
    fn mask_rows(&mut self) -> Result<Value> {
        if let Some(v) = &self.positions()?.mask {
            return Ok(v.clone());
        }
        let full = self.causal_mask()?;
        self.g.push_scope("shared");
        let rows = self.rows_of("causal_mask_rows", &full, 0);
        let v = rows.and_then(|r| self.first_columns("causal_mask_columns", &r));
        self.g.pop_scope();
        let v = v?;
        if let Some(pos) = self.positions.as_mut() {
            pos.mask = Some(v.clone());
        }
        Ok(v)
    }

    /// `past` (a graph input) followed by `new` along the tokens; the result is also the
    /// `present_*` output `kind`.
    fn with_past(&mut self, past: &str, kind: &str, new: &Value) -> Result<Value> {
        let past_value = self
            .past
            .get(past)
            .cloned()
            .ok_or_else(|| Error::Internal(format!("no graph input {past}")))?;
        let past_value = self.cast_to(&format!("past_{kind}_cast"), &past_value, new.elem)?;
        let total_dim = self.positions()?.total_dim.clone();
        let all =
            self.g
                .concat_symbolic(&format!("{kind}_concat"), &[&past_value, new], 1, total_dim)?;
        let present = self.cast_to(&format!("present_{kind}_to_f32"), &all, ElemType::F32)?;
        self.present
            .push((past.replacen("past_", "present_", 1), present));
        Ok(all)
    }

    /// W[P:P+T, 0:P+T] · u[0:P+T] + b[P:P+T] with u = the past (if any) followed by `z2`.
    fn spatial_projection_rows(&mut self, z2: &Value, p: &str, i: usize) -> Result<Value> {
        let name = format!("{p}.sgu.spatial.weight");
        let n = self.cfg.seq_len();
        let causal = self.cfg.causal;
        let heads = self.cfg.heads;
        let row_axis = usize::from(heads > 1);
        // int8 models: Wᵀ's columns P..P+T−1 (rows 0..P+T−1) of the quantized matrix
        // (emit/dense.rs); f32/f16: W's rows P..P+T−1 (columns 0..P+T−1).
        let int8 = self.cfg.dtype == Precision::Int8;
        let w = match self.cfg.spatial {
            _ if int8 => None,
            SpatialForm::ToeplitzGather => {
                let dims = self.head_dims(&[2 * n - 1]);
                let vector = self.lazy_param(&name, &dims, move |mut w| {
                    if causal {
                        w.chunks_mut(2 * n - 1).for_each(|v| v[n..].fill(0.0));
                    }
                    w
                })?;
                let index = self.toeplitz_index_rows()?;
                Some(
                    self.g
                        .gather("spatial_weight_gather", &vector, &index, dims.len() - 1)?,
                )
            }
            SpatialForm::Dense | SpatialForm::ToeplitzExpand => {
                let full = self.spatial_weight(&name)?;
                let rows = self.rows_of("spatial_weight_rows", &full, row_axis)?;
                Some(self.first_columns("spatial_weight_columns", &rows)?)
            }
        };
        let mix = |s: &mut Self, u: &Value| match &w {
            Some(w) => s.g.matmul("spatial_matmul", w, u),
            None => s.spatial_matmul_int8_rows("spatial_matmul", &name, u),
        };
        let b = self.spatial_bias(&format!("{p}.sgu.spatial.bias"))?;
        let b = self.rows_of("spatial_bias_rows", &b, row_axis)?;
        let u = if self.mode == SequenceMode::WithPast {
            self.with_past(&format!("past_sgu.{i}"), "sgu", z2)?
        } else {
            z2.clone()
        };
        if heads == 1 {
            let mixed = mix(self, &u)?;
            return self.g.add("spatial_bias", &mixed, &b);
        }
        let e = self.cfg.gate_dim();
        let c = e / heads;
        let (batch, total) = (u.shape[0].clone(), u.shape[1].clone());
        let seq = z2.shape[1].clone();
        let split = self.g.reshape(
            "split_heads",
            &u,
            &[0, -1, heads as i64, c as i64],
            vec![batch.clone(), total, Dim::Fixed(heads), Dim::Fixed(c)],
        )?;
        let per_head = self.g.transpose("heads_first", &split, &[0, 2, 1, 3])?;
        let mixed = mix(self, &per_head)?;
        let biased = self.g.add("spatial_bias", &mixed, &b)?;
        let back = self.g.transpose("tokens_first", &biased, &[0, 2, 1, 3])?;
        self.g.reshape(
            "merge_heads",
            &back,
            &[0, -1, e as i64],
            vec![batch, seq, Dim::Fixed(e)],
        )
    }

    /// Token shift for a variable length (causal shifts a ≥ 0 only): pad a zeros in front,
    /// keep the first T positions.
    fn shift_tokens_variable(&mut self, h: &Value) -> Result<Value> {
        let (amounts, parts) = self.shift_chunks(h)?;
        let mut shifted = Vec::with_capacity(parts.len());
        for (k, part) in parts.iter().enumerate() {
            let a = amounts.get(k).copied().unwrap_or(0);
            if a == 0 {
                shifted.push(part.clone());
                continue;
            }
            if a < 0 {
                return Err(Error::Internal(
                    "a variable-length token shift must be causal".into(),
                ));
            }
            let a = a as usize;
            let padded = self.g.pad_axis_symbolic(
                &format!("shift_{k}_pad"),
                part,
                1,
                (a, 0),
                Dim::Symbol(format!("{SEQUENCE} + {a}")),
            )?;
            let start = self
                .g
                .const_i64(&format!("shift_{k}_start"), &[1], vec![0])?;
            let end = self
                .g
                .const_i64(&format!("shift_{k}_end"), &[1], vec![-(a as i64)])?;
            shifted.push(self.g.slice_dynamic(
                &format!("shift_{k}"),
                &padded,
                &start,
                &end,
                &[1],
                part.shape.clone(),
            )?);
        }
        let refs: Vec<&Value> = shifted.iter().collect();
        self.g.concat("concat", &refs, -1)
    }
    /// Token shift with state (causal shifts a ≥ 0): `past_shift.{i}` holds the block's
    /// last L = min(P, s) normalized inputs, `full` = past ‖ h has L + T rows, and chunk k
    /// of new row t reads full's row L + t − a, zero before position 0: pad a zeros in
    /// front of the chunk and keep rows L..L+T. `present_shift.{i}` = the last
    /// min(L + T, s) rows of `full`.
    fn shift_tokens_with_past(&mut self, h: &Value, i: usize) -> Result<Value> {
        let name = format!("past_shift.{i}");
        let past = self
            .past
            .get(&name)
            .cloned()
            .ok_or_else(|| Error::Internal(format!("no graph input {name}")))?;
        let past = self.cast_to("past_shift_cast", &past, h.elem)?;
        let full_rows = format!("{PAST_SHIFT_SEQUENCE} + {SEQUENCE}");
        let full = self.g.concat_symbolic(
            "past_concat",
            &[&past, h],
            1,
            Dim::Symbol(full_rows.clone()),
        )?;
        let kept = self.g.shape_of("past_rows", &past, 1, 2)?;
        let len = self.g.shape_of("all_rows", &full, 1, 2)?;
        let window = self
            .g
            .const_i64("window", &[1], vec![self.cfg.shift_tokens as i64])?;
        let zero = self.g.const_i64("window_zero", &[1], vec![0])?;
        let over = self.g.sub("window_over", &len, &window)?;
        let start = self.g.max("window_start", &over, &zero)?;
        let mut window_shape = full.shape.clone();
        window_shape[1] = Dim::Symbol(PRESENT_SHIFT_SEQUENCE.into());
        let present =
            self.g
                .slice_dynamic("window_rows", &full, &start, &len, &[1], window_shape)?;
        let present = self.cast_to("present_shift_to_f32", &present, ElemType::F32)?;
        self.present.push((format!("present_shift.{i}"), present));
        let (amounts, parts) = self.shift_chunks(&full)?;
        let mut shifted = Vec::with_capacity(parts.len());
        for (k, part) in parts.iter().enumerate() {
            let a = amounts.get(k).copied().unwrap_or(0);
            let source = match usize::try_from(a) {
                Ok(0) => part.clone(),
                Ok(a) => self.g.pad_axis_symbolic(
                    &format!("shift_{k}_pad"),
                    part,
                    1,
                    (a, 0),
                    Dim::Symbol(format!("{full_rows} + {a}")),
                )?,
                Err(_) => {
                    return Err(Error::Internal(
                        "a token shift with state must be causal".into(),
                    ))
                }
            };
            let mut rows = part.shape.clone();
            rows[1] = h.shape[1].clone();
            shifted.push(self.g.slice_dynamic(
                &format!("shift_{k}"),
                &source,
                &kept,
                &len,
                &[1],
                rows,
            )?);
        }
        let refs: Vec<&Value> = shifted.iter().collect();
        self.g.concat("concat", &refs, -1)
    }
}

/// Emits the whole network for `cfg` at `opset`, with parameter values taken from
/// `source` when the graph is written, with a fixed sequence length.
pub fn build_graph(cfg: &GmlpConfig, source: Arc<dyn WeightSource>, opset: i64) -> Result<Graph> {
    build_graph_in(cfg, source, opset, OpForms::default(), SequenceMode::Fixed)
}

/// [`build_graph`] with the operations spelled in `forms` (a `--target` profile's) and
/// the sequence axis emitted as `mode` says (fixed, variable length, or variable length
/// with the per-block state in and out).
pub fn build_graph_in(
    cfg: &GmlpConfig,
    source: Arc<dyn WeightSource>,
    opset: i64,
    forms: OpForms,
    mode: SequenceMode,
) -> Result<Graph> {
    cfg.validate()?;
    mode.check(cfg)?;
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
        mode,
        positions: None,
        past: HashMap::new(),
        present: Vec::new(),
    };
    let (mut x, embedding) = em.embed()?;
    for i in 0..cfg.layers {
        x = em.scoped(&format!("blocks.{i}"), |s| s.block(i, &x))?;
    }
    let h = em.layer_norm("final_norm", &x, "norm", cfg.norm_eps)?;
    let logits = em.head(&h, embedding)?;
    let logits = em.cast_to("logits_to_f32", &logits, ElemType::F32)?;
    let logits = em.g.rename(&logits, LOGITS)?;
    let mut outputs = vec![logits];
    // The present_* outputs in the order of the past_* inputs (sgu, key, value per block).
    let mut present = std::mem::take(&mut em.present);
    for state in (0..cfg.layers).flat_map(|i| block_state(cfg, i)) {
        if let Some(k) = present.iter().position(|(name, _)| *name == state.present) {
            let (name, value) = present.remove(k);
            outputs.push(em.g.rename(&value, &name)?);
        }
    }
    Ok(em.g.finish("gmlp", outputs))
}
