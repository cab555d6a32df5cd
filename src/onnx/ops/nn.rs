//! Neural-network operators: normalizations (`LayerNormalization` or its decomposition,
//! RMSNorm from primitives), GELU (exact: `Gelu` at opset 20 or the erf form; tanh
//! approximation), SiLU, `Softmax`, and convolutions (the patch stem's `Conv`, a causal
//! depthwise `Conv` over the sequence).

use crate::error::Result;
use crate::onnx::builder::GraphBuilder;
use crate::onnx::forms::{LayerNormForm, PatchForm};
use crate::onnx::graph::{Attr, Dim, ElemType, Value};
use crate::onnx::shape::{fmt_shape, normalize_axis, shape_error};

/// First opset with `Attention`.
pub const ATTENTION_OPSET: i64 = 23;

impl GraphBuilder {
    /// LayerNorm over the last axis: `(x − mean) / √(var + eps) · scale + bias`, as the
    /// `LayerNormalization` operator from opset 17, and as primitive ops (see
    /// [`GraphBuilder::layer_norm_decomposed`]) below 17 or when the op forms ask for it.
    ///
    /// [LayerNormalization](https://onnx.ai/onnx/operators/onnx__LayerNormalization.html): new in opset 17 (its only version); below 17 it does not exist.
    pub fn layer_norm(
        &mut self,
        local: &str,
        x: &Value,
        scale: &Value,
        bias: &Value,
        epsilon: f32,
    ) -> Result<Value> {
        let last = x.shape.last().cloned();
        if last.is_none() || scale.shape.last() != last.as_ref() || bias.shape != scale.shape {
            return Err(shape_error(
                "LayerNormalization",
                format!(
                    "x {} with scale {} and bias {}",
                    fmt_shape(&x.shape),
                    fmt_shape(&scale.shape),
                    fmt_shape(&bias.shape)
                ),
            ));
        }
        if self.opset() < 17 || self.forms().layer_norm == LayerNormForm::Decomposed {
            return self.layer_norm_decomposed(local, x, scale, bias, epsilon);
        }
        let attrs = vec![
            ("axis".to_string(), Attr::Int(-1)),
            ("epsilon".to_string(), Attr::Float(epsilon)),
        ];
        Ok(self.single(
            local,
            "LayerNormalization",
            &[x, scale, bias],
            attrs,
            (x.elem, x.shape.clone()),
            0,
        ))
    }

    /// ONNX Runtime's `SkipLayerNormalization`: `s = x + skip (+ bias)` and LayerNorm of `s`
    /// over the last axis with `scale` and `shift`, in one kernel; returns the normalized
    /// value and `s` itself (output 3, `input_skip_bias_sum`), which carries a residual
    /// stream on to the next block. Outputs 1 and 2 (mean, inverse standard deviation) are
    /// not asked for (the CUDA kernel does not produce them).
    ///
    /// [SkipLayerNormalization](https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.SkipLayerNormalization):
    /// ONNX Runtime contrib operator, domain `com.microsoft` version 1 (its only version;
    /// output 3 since ONNX Runtime 1.13); CPU and CUDA kernels for f32 and f16.
    #[allow(clippy::too_many_arguments)]
    pub fn skip_layer_norm(
        &mut self,
        local: &str,
        x: &Value,
        skip: &Value,
        scale: &Value,
        shift: &Value,
        bias: Option<&Value>,
        epsilon: f32,
    ) -> Result<(Value, Value)> {
        let last = x.shape.last().cloned();
        let fits = |v: &Value| v.shape.len() == 1 && v.shape.last() == last.as_ref();
        if x.shape != skip.shape
            || x.elem != skip.elem
            || !fits(scale)
            || !fits(shift)
            || !bias.is_none_or(fits)
        {
            return Err(shape_error(
                "SkipLayerNormalization",
                format!(
                    "x {} with skip {}, scale {} and shift {}",
                    fmt_shape(&x.shape),
                    fmt_shape(&skip.shape),
                    fmt_shape(&scale.shape),
                    fmt_shape(&shift.shape)
                ),
            ));
        }
        let mut inputs = vec![x, skip, scale, shift];
        inputs.extend(bias);
        let attrs = vec![("epsilon".to_string(), Attr::Float(epsilon))];
        let stats: Vec<Dim> = x.shape[..x.shape.len() - 1]
            .iter()
            .cloned()
            .chain([Dim::Fixed(1)])
            .collect();
        let outputs = vec![
            (x.elem, x.shape.clone()),
            (ElemType::F32, stats.clone()),
            (ElemType::F32, stats),
            (x.elem, x.shape.clone()),
        ];
        let mut out = self.node_skipping_outputs(
            local,
            "SkipLayerNormalization",
            &inputs,
            attrs,
            outputs,
            &[1, 2],
        );
        let sum = out.pop().expect("four outputs");
        let normalized = out.swap_remove(0);
        Ok((normalized, sum))
    }

    /// Single-head scaled dot-product attention `softmax(q·kᵀ · scale + mask) · v` as the
    /// ONNX `Attention` operator on 3-D inputs (q `[batch, T, a]`, k and v `[batch, S, a]`,
    /// one head each), with the additive f32 `mask` `[batch or 1, 1, T, S]` if any.
    ///
    /// [Attention](https://onnx.ai/onnx/operators/onnx__Attention.html): new in opset 23,
    /// 24 (`nonpad_kv_seqlen`, not used here); refused below 23. ONNX Runtime has CPU and
    /// CUDA kernels (1.23 on).
    pub fn attention(
        &mut self,
        local: &str,
        q: &Value,
        k: &Value,
        v: &Value,
        mask: Option<&Value>,
        scale: f32,
    ) -> Result<Value> {
        let mask_fits = mask.is_none_or(|m| m.shape.len() == 4 && m.shape[3] == k.shape[1]);
        let ok = self.opset() >= ATTENTION_OPSET
            && q.shape.len() == 3
            && k.shape.len() == 3
            && v.shape == k.shape
            && q.shape[2] == k.shape[2]
            && q.shape[0] == k.shape[0]
            && mask_fits
            && q.elem == k.elem
            && k.elem == v.elem;
        if !ok {
            return Err(shape_error(
                "Attention",
                format!(
                    "q {} k {} v {} mask {} (opset {}, needs {ATTENTION_OPSET})",
                    fmt_shape(&q.shape),
                    fmt_shape(&k.shape),
                    fmt_shape(&v.shape),
                    mask.map_or("none".into(), |m| fmt_shape(&m.shape)),
                    self.opset()
                ),
            ));
        }
        let attrs = vec![
            ("kv_num_heads".to_string(), Attr::Int(1)),
            ("q_num_heads".to_string(), Attr::Int(1)),
            ("scale".to_string(), Attr::Float(scale)),
        ];
        // q·kᵀ and the weights times v: 2·T·S·a FLOPs each per batch element.
        let (t, s, a) = (&q.shape[1], &k.shape[1], &q.shape[2]);
        let flops = 4 * (t.size_or_one() * s.size_or_one() * a.size_or_one()) as u64;
        let inputs: Vec<&Value> = [q, k, v].into_iter().chain(mask).collect();
        Ok(self.single(
            local,
            "Attention",
            &inputs,
            attrs,
            (q.elem, q.shape.clone()),
            flops,
        ))
    }

    /// Exact GELU `0.5·x·(1 + erf(x/√2))`: the `Gelu` operator (approximate = "none") from
    /// opset 20, the same formula spelled with `Div`/`Erf`/`Add`/`Mul` below it, in the
    /// exact node pattern ONNX Runtime's `GeluFusion` rewrites into one `Gelu` kernel
    /// (`Div(x, √2) → Erf → Add(1) → Mul(x, ·) → Mul(·, 0.5)`, its "pattern 2"; a `Mul` by
    /// 1/√2 is not matched), which its `BiasGeluFusion` then merges with a preceding bias
    /// `Add`. The other order, `Mul(Mul(x, 0.5), ·)`, which ONNX Runtime fuses too, crashes
    /// OpenCV 4.14 and 5.0 dnn (segmentation fault on import; found by the consumer matrix).
    ///
    /// [Gelu](https://onnx.ai/onnx/operators/onnx__Gelu.html): new in opset 20 (`approximate = "none"` is the default); below 20 the formula is spelled with [Div](https://onnx.ai/onnx/operators/onnx__Div.html) and [Erf](https://onnx.ai/onnx/operators/onnx__Erf.html) (versions 9, 13).
    pub fn gelu(&mut self, local: &str, x: &Value) -> Result<Value> {
        if self.opset() >= 20 {
            return Ok(self.single(local, "Gelu", &[x], vec![], (x.elem, x.shape.clone()), 0));
        }
        let sqrt2 = self.const_float(
            &format!("{local}_sqrt2"),
            &[],
            vec![std::f32::consts::SQRT_2],
            x.elem,
        )?;
        let one = self.const_float(&format!("{local}_one"), &[], vec![1.0], x.elem)?;
        let half = self.const_float(&format!("{local}_half"), &[], vec![0.5], x.elem)?;
        let scaled = self.binary(&format!("{local}_scale"), "Div", x, &sqrt2)?;
        let erf = self.single(
            &format!("{local}_erf"),
            "Erf",
            &[&scaled],
            vec![],
            (x.elem, x.shape.clone()),
            0,
        );
        let one_plus = self.add(&format!("{local}_one_plus"), &erf, &one)?;
        let x_one_plus = self.mul(&format!("{local}_x_one_plus"), x, &one_plus)?;
        self.mul(local, &x_one_plus, &half)
    }

    /// `Softmax` along `axis` (opset ≥ 13 semantics: over that one axis).
    ///
    /// [Softmax](https://onnx.ai/onnx/operators/onnx__Softmax.html): versions 1, 11, 13 (from 13 over the one `axis`, before it over the flattened trailing axes).
    pub fn softmax(&mut self, local: &str, x: &Value, axis: i64) -> Result<Value> {
        normalize_axis("Softmax", axis, x.shape.len())?;
        Ok(self.single(
            local,
            "Softmax",
            &[x],
            vec![("axis".to_string(), Attr::Int(axis))],
            (x.elem, x.shape.clone()),
            0,
        ))
    }

    /// 2-D `Conv` (NCHW) with square kernel `kernel`, stride `stride`, no padding.
    ///
    /// [Conv](https://onnx.ai/onnx/operators/onnx__Conv.html): versions 1, 11, 22 (types only); the same form in every opset here.
    pub fn conv2d(
        &mut self,
        local: &str,
        x: &Value,
        weight: &Value,
        bias: &Value,
        kernel: usize,
        stride: usize,
    ) -> Result<Value> {
        let (c_out, c_in, h, w) = Self::conv2d_output(x, weight, kernel, stride)?;
        let positions = (h.size_or_one() * w.size_or_one()) as u64;
        let flops = 2 * positions * (c_out * c_in * kernel * kernel) as u64;
        let k = kernel as i64;
        let s = stride as i64;
        Ok(self.single(
            local,
            "Conv",
            &[x, weight, bias],
            vec![
                ("kernel_shape".to_string(), Attr::Ints(vec![k, k])),
                ("strides".to_string(), Attr::Ints(vec![s, s])),
            ],
            (x.elem, vec![x.shape[0].clone(), Dim::Fixed(c_out), h, w]),
            flops,
        ))
    }

    /// The tokens `[B, n, d]` of a projection of non-overlapping `patch` × `patch` patches
    /// of `x` `[B, c, H, W]` by `weight` `[d, c, patch, patch]` and `bias` `[d]`,
    /// n = (H/patch)·(W/patch) in row-major patch order, in the graph's
    /// [`PatchForm`]: a `Conv` then `Reshape` and
    /// `Transpose` (nodes `patch_conv`, `flatten`, `to_tokens`), or the patches cut out and
    /// one `MatMul` (which needs H and W multiples of `patch`).
    pub fn patch_tokens(
        &mut self,
        x: &Value,
        weight: &Value,
        bias: &Value,
        patch: usize,
    ) -> Result<Value> {
        let (d, c, h, w) = Self::conv2d_output(x, weight, patch, patch)?;
        let batch = x.shape[0].clone();
        let (Dim::Fixed(gh), Dim::Fixed(gw)) = (h, w) else {
            return Err(shape_error("Conv", "a feature map of fixed size".into()));
        };
        let n = gh * gw;
        match self.forms().patch {
            PatchForm::Conv => {
                let fmap = self.conv2d("patch_conv", x, weight, bias, patch, patch)?;
                // [B, d, h, w] -> [B, d, n] -> [B, n, d]: tokens in row-major patch order.
                let flat = self.reshape(
                    "flatten",
                    &fmap,
                    &[0, d as i64, -1],
                    vec![batch, Dim::Fixed(d), Dim::Fixed(n)],
                )?;
                self.transpose("to_tokens", &flat, &[0, 2, 1])
            }
            PatchForm::MatMul => {
                if x.shape[2] != Dim::Fixed(gh * patch) || x.shape[3] != Dim::Fixed(gw * patch) {
                    return Err(shape_error(
                        "MatMul",
                        format!("patches of {patch} in {}", fmt_shape(&x.shape)),
                    ));
                }
                let (p, k) = (patch as i64, c * patch * patch);
                let cut = self.reshape(
                    "patch_grid",
                    x,
                    &[0, c as i64, gh as i64, p, gw as i64, p],
                    vec![
                        batch.clone(),
                        Dim::Fixed(c),
                        Dim::Fixed(gh),
                        Dim::Fixed(patch),
                        Dim::Fixed(gw),
                        Dim::Fixed(patch),
                    ],
                )?;
                // [B, h, w, c, p, p]: each patch's values in the conv weight's order.
                let grouped = self.transpose("patch_order", &cut, &[0, 2, 4, 1, 3, 5])?;
                let patches = self.reshape(
                    "patches",
                    &grouped,
                    &[0, n as i64, k as i64],
                    vec![batch, Dim::Fixed(n), Dim::Fixed(k)],
                )?;
                let rows = self.reshape(
                    "patch_weight_rows",
                    weight,
                    &[d as i64, k as i64],
                    vec![Dim::Fixed(d), Dim::Fixed(k)],
                )?;
                let columns = self.transpose("patch_weight", &rows, &[1, 0])?;
                let projected = self.matmul("patch_projection", &patches, &columns)?;
                self.add("to_tokens", &projected, bias)
            }
        }
    }

    /// The output channels and input channels of [`Self::conv2d`] and its output's spatial
    /// sizes, checked: square kernel `kernel` of `weight` over `x`'s channels, no padding.
    fn conv2d_output(
        x: &Value,
        weight: &Value,
        kernel: usize,
        stride: usize,
    ) -> Result<(usize, usize, Dim, Dim)> {
        let (c_out, c_in) = match (&weight.shape[..], x.shape.len()) {
            ([Dim::Fixed(o), Dim::Fixed(i), Dim::Fixed(kh), Dim::Fixed(kw)], 4)
                if *kh == kernel && *kw == kernel && x.shape[1] == Dim::Fixed(*i) =>
            {
                (*o, *i)
            }
            _ => {
                return Err(shape_error(
                    "Conv",
                    format!(
                        "x {} with weight {}",
                        fmt_shape(&x.shape),
                        fmt_shape(&weight.shape)
                    ),
                ))
            }
        };
        let out_hw = |d: &Dim| match d {
            Dim::Fixed(n) if *n >= kernel => Ok(Dim::Fixed((n - kernel) / stride + 1)),
            _ => Err(shape_error(
                "Conv",
                format!("spatial size {d} with kernel {kernel}"),
            )),
        };
        let (h, w) = (out_hw(&x.shape[2])?, out_hw(&x.shape[3])?);
        Ok((c_out, c_in, h, w))
    }

    /// LayerNorm over the last axis as primitive ops, for opsets below 17 (no
    /// `LayerNormalization`) and consumers without the operator:
    /// `μ = mean(x)`, `c = x − μ`, `σ² = mean(c·c)`, `y = c / √(σ² + ε) · scale + bias`,
    /// the means in the graph's [`MeanForm`](crate::onnx::forms::MeanForm). It is the operator's definition spelled out
    /// (two-pass variance), so it agrees with `LayerNormalization` to float rounding. The
    /// last node is named `local`, like the operator's.
    pub fn layer_norm_decomposed(
        &mut self,
        local: &str,
        x: &Value,
        scale: &Value,
        bias: &Value,
        epsilon: f32,
    ) -> Result<Value> {
        if x.shape.last().is_none() || scale.shape.last() != x.shape.last() {
            return Err(shape_error(
                "LayerNormalization",
                format!(
                    "x {} with scale {}",
                    fmt_shape(&x.shape),
                    fmt_shape(&scale.shape)
                ),
            ));
        }
        let mean = self.mean(&format!("{local}_mean"), x, &[-1], true)?;
        let centered = self.sub(&format!("{local}_centered"), x, &mean)?;
        let squared = self.mul(&format!("{local}_squared"), &centered, &centered)?;
        let variance = self.mean(&format!("{local}_variance"), &squared, &[-1], true)?;
        let eps = self.const_float(&format!("{local}_epsilon"), &[], vec![epsilon], x.elem)?;
        let shifted = self.add(&format!("{local}_variance_eps"), &variance, &eps)?;
        let std = self.sqrt(&format!("{local}_std"), &shifted)?;
        let normalized = self.div(&format!("{local}_normalized"), &centered, &std)?;
        let scaled = self.mul(&format!("{local}_scale"), &normalized, scale)?;
        self.add(local, &scaled, bias)
    }

    /// SiLU `x·sigmoid(x)` (PyTorch's `nn.SiLU`), as `Sigmoid` and `Mul` (ONNX has no SiLU
    /// operator; ONNX Runtime fuses this pair into `QuickGelu`-style kernels itself).
    pub fn silu(&mut self, local: &str, x: &Value) -> Result<Value> {
        let s = self.sigmoid(&format!("{local}_sigmoid"), x)?;
        self.mul(local, x, &s)
    }

    /// GELU's tanh approximation `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`: the `Gelu`
    /// operator with `approximate = "tanh"` from opset 20, the formula spelled with
    /// `Mul`/`Add`/`Tanh` below it.
    ///
    /// [Gelu](https://onnx.ai/onnx/operators/onnx__Gelu.html): new in opset 20 (attribute `approximate`, "none" or "tanh").
    pub fn gelu_tanh(&mut self, local: &str, x: &Value) -> Result<Value> {
        if self.opset() >= 20 {
            let approximate = ("approximate".to_string(), Attr::String("tanh".into()));
            return Ok(self.single(
                local,
                "Gelu",
                &[x],
                vec![approximate],
                (x.elem, x.shape.clone()),
                0,
            ));
        }
        let c = |g: &mut Self, name: &str, v: f32| {
            g.const_float(&format!("{local}_{name}"), &[], vec![v], x.elem)
        };
        let cubic_coef = c(self, "coef", 0.044715)?;
        let root = c(self, "sqrt_2_over_pi", (2.0 / std::f32::consts::PI).sqrt())?;
        let one = c(self, "one", 1.0)?;
        let half = c(self, "half", 0.5)?;
        let x2 = self.mul(&format!("{local}_square"), x, x)?;
        let x3 = self.mul(&format!("{local}_cube"), &x2, x)?;
        let scaled_cube = self.mul(&format!("{local}_cube_coef"), &x3, &cubic_coef)?;
        let inner = self.add(&format!("{local}_inner"), x, &scaled_cube)?;
        let arg = self.mul(&format!("{local}_arg"), &inner, &root)?;
        let t = self.tanh(&format!("{local}_tanh"), &arg)?;
        let one_plus = self.add(&format!("{local}_one_plus"), &t, &one)?;
        let x_one_plus = self.mul(&format!("{local}_x_one_plus"), x, &one_plus)?;
        self.mul(local, &x_one_plus, &half)
    }

    /// RMS normalization over the last axis, `x / √(mean(x²) + ε) · γ` (tinygrad's
    /// `nn.RMSNorm`), spelled `Mul → ReduceMean → Add → Sqrt → Div → Mul` (ONNX's
    /// `RMSNormalization` is new in opset 23, past this builder's range).
    pub fn rms_norm(&mut self, local: &str, x: &Value, scale: &Value, eps: f32) -> Result<Value> {
        let square = self.mul(&format!("{local}_square"), x, x)?;
        let mean = self.reduce_mean_keeping(&format!("{local}_mean"), &square, &[-1], true)?;
        let eps = self.const_float(&format!("{local}_eps"), &[], vec![eps], x.elem)?;
        let shifted = self.add(&format!("{local}_add_eps"), &mean, &eps)?;
        let root = self.sqrt(&format!("{local}_sqrt"), &shifted)?;
        let normed = self.div(&format!("{local}_div"), x, &root)?;
        self.mul(local, &normed, scale)
    }

    /// A depthwise 1-D `Conv` over `x` [batch, channels, length] with `weight`
    /// [channels, 1, kernel] and `bias` \[channels\], `group = channels`, padded with
    /// `kernel − 1` zeros in front (causal) and none behind: output length = input length.
    ///
    /// [Conv](https://onnx.ai/onnx/operators/onnx__Conv.html): versions 1, 11 (`auto_pad` semantics), 22 (types); explicit `pads` and `group` are valid over the whole range here.
    pub fn conv1d_causal_depthwise(
        &mut self,
        local: &str,
        x: &Value,
        weight: &Value,
        bias: &Value,
    ) -> Result<Value> {
        let (channels, kernel) = match (&weight.shape[..], &x.shape[..]) {
            ([Dim::Fixed(c), Dim::Fixed(1), Dim::Fixed(k)], [_, Dim::Fixed(xc), _]) if c == xc => {
                (*c, *k)
            }
            _ => {
                return Err(shape_error(
                    "Conv",
                    format!(
                        "depthwise 1-D: x {} with weight {}",
                        fmt_shape(&x.shape),
                        fmt_shape(&weight.shape)
                    ),
                ))
            }
        };
        let flops = 2 * (channels * kernel * x.shape[2].size_or_one()) as u64;
        Ok(self.single(
            local,
            "Conv",
            &[x, weight, bias],
            vec![
                ("kernel_shape".to_string(), Attr::Ints(vec![kernel as i64])),
                ("group".to_string(), Attr::Int(channels as i64)),
                ("pads".to_string(), Attr::Ints(vec![kernel as i64 - 1, 0])),
            ],
            (x.elem, x.shape.clone()),
            flops,
        ))
    }
}
