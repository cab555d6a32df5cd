//! The graph edit that turns a static-state file (docs/static-state.md) into the model of a
//! genai folder, with the built file's nodes and weights: genai's names and shapes at the
//! interface, the same arithmetic inside.
//!
//! - Each state tensor `past_X` `[batch, n, w]` becomes the key or value of its genai layer
//!   ([`super::layout`]), declared `[batch, 1, n, w]`. Its scatter writes the rank-4 tensor
//!   directly and is the graph output (so that genai's shared past/present buffer is written
//!   in place, as before): `ScatterND` gets the indices (b, 0, row) instead of (b, row);
//!   `TensorScatter` writes along axis 2 an update with a new axis 1. A `Reshape` (no copy)
//!   gives the rest of the graph the `[batch, n, w]` view it read before.
//! - `position` `[batch]` is computed as `position_ids[:, 0]` (genai gives each token its
//!   position; a row's first is its P); `attention_mask` is declared, as genai feeds it, and
//!   unused: the state's rows and the causal weights already say which tokens count.
//! - Without an end token among the model's ids, the logits get one more entry, −∞, the id
//!   the folder declares as end and pad token: the model never picks it, genai never stops
//!   early, and pads fed as input read the last real embedding row instead (`Min`).

use std::collections::{BTreeMap, HashSet};

use crate::error::{Error, Result};
use crate::gmlp::emit::{INPUT_IDS, LOGITS};
use crate::gmlp::interface::{DecodingInfo, SequenceMode, StateStart, POSITION};
use crate::gmlp::metadata::DECODING_KEY;
use crate::message::{Phrase, Setting};
use crate::onnx::dtype::DataType;
use crate::onnx::edit::{
    concat_node, gather_axis_node, identity_node, min_node, mul_node, reshape_node, slice_node,
    unsqueeze_node, ModelEdit,
};
use crate::onnx::graph::{Dim, Node};
use crate::onnx::proto as onnx;
use crate::onnx::reader::{declared_outputs, updates_in_place};

use super::layout::{pair_states, GenaiLayer, Slot};
use super::{refused, refused_for_setting, EndToken, GENAI_METADATA_KEY};

/// genai's input of each token's position (`decoder.inputs.position_ids`).
pub const POSITION_IDS: &str = "position_ids";
/// genai's attention mask input (`decoder.inputs.attention_mask`).
pub const ATTENTION_MASK: &str = "attention_mask";

/// Refuses a model whose decoding form genai cannot run, saying what to build instead.
pub fn check_decoding(info: Option<&DecodingInfo>) -> Result<&DecodingInfo> {
    let Some(info) = info else {
        return Err(refused_for_setting(
            Phrase::text(
                "it is not a causal token model with a carried state (build a causal model with ",
            )
            .and(Setting::Causal)
            .then(" ")
            .and(Setting::WithPast)
            .then(")"),
        ));
    };
    match info.mode {
        SequenceMode::Static if info.state_start == StateStart::Zeroed => Err(refused_for_setting(
            Phrase::text(
                "its state buffers must start zeroed, which genai does not do on every device (build it without ",
            )
            .and(Setting::Target)
            .then(" onnxruntime: the default target's step ignores whatever the buffers hold)"),
        )),
        SequenceMode::Static => Ok(info),
        SequenceMode::Fixed | SequenceMode::Variable => Err(refused_for_setting(
            Phrase::text("it carries no state between runs (build it with ")
                .and(Setting::WithPast)
                .then(")"),
        )),
        SequenceMode::Growing => Err(refused_for_setting(
            Phrase::text("its state grows with every token, which genai cannot share in place (build it with ")
                .and(Setting::WithPast)
                .then(", the static state)"),
        )),
    }
}

/// Edits `model`, a static-state file described by `info`, into genai's interface (see the
/// module doc); `vocab` is the model's vocabulary size. Returns the layers, also recorded
/// in the metadata under [`GENAI_METADATA_KEY`] (which replaces the decoding description:
/// the edited model is no longer a static-state file of this tool).
pub fn adapt_for_genai(
    model: &mut onnx::ModelProto,
    info: &DecodingInfo,
    vocab: usize,
    end: EndToken,
) -> Result<Vec<GenaiLayer>> {
    check_scatters(model, info)?;
    let logits_type = logits_type(model)?;
    let layers = pair_states(&info.state);
    let edit = ModelEdit::new(model).ok_or_else(|| refused("it has no graph"))?;
    if edit.has_subgraphs() {
        return Err(refused("it has subgraphs (If, Loop, Scan)"));
    }
    let mut a = Adapter {
        fresh: Fresh(edit.value_names()),
        edit,
        batch: Dim::Symbol("batch".into()),
        n: info.max_sequence,
        before: Vec::new(),
        after: Vec::new(),
        indices4: BTreeMap::new(),
        view_shapes: BTreeMap::new(),
        uses_scatter_nd: false,
        uses_tensor_scatter: false,
    };
    a.position_from_ids()?;

    // The constants of the rank-4 writes.
    let names = Constants::new(&a.fresh)?;
    for layer in &layers {
        for (k, (past4, present4, slot)) in layer.tensors().into_iter().enumerate() {
            let (past4, present4) = (a.fresh.name(&past4)?, a.fresh.name(&present4)?);
            match slot {
                Slot::Spare => a.spare(layer, k, &past4, &present4),
                Slot::State { past, present } => {
                    a.state(&names, layer.width, (past, present), (&past4, &present4))?
                }
            }
        }
    }

    let added_logit = matches!(end, EndToken::Added(_));
    names.add(
        &mut a.edit,
        a.uses_scatter_nd,
        a.uses_tensor_scatter,
        added_logit,
    );
    if let EndToken::Added(id) = end {
        a.end_token(&names, vocab, id, logits_type)?;
    }
    let Adapter {
        mut edit,
        before,
        after,
        ..
    } = a;
    edit.wrap_nodes(&before, &after);
    edit.remove_metadata(DECODING_KEY);
    let json = serde_json::to_string(&layers).map_err(|e| Error::Internal(e.to_string()))?;
    edit.add_metadata(GENAI_METADATA_KEY, &json);
    Ok(layers)
}

/// Refuses a model whose state tensors are not each written in place by one scatter.
fn check_scatters(model: &onnx::ModelProto, info: &DecodingInfo) -> Result<()> {
    for s in &info.state {
        if !updates_in_place(model, &s.past, &s.present) {
            return Err(refused(&format!(
                "its state {} is not written by one scatter into {} (not a static-state file of this tool)",
                s.past, s.present
            )));
        }
    }
    Ok(())
}

/// The element type of the model's declared logits output (`Undefined` for an unknown
/// code); refuses a model without one.
fn logits_type(model: &onnx::ModelProto) -> Result<DataType> {
    let logits_type = declared_outputs(model)
        .into_iter()
        .find(|t| t.name == LOGITS)
        .map(|t| t.elem_type)
        .ok_or_else(|| refused("it has no logits output"))?;
    Ok(DataType::try_from(logits_type).unwrap_or(DataType::Undefined))
}

/// The names the model already uses: a name the edit adds must be none of them.
struct Fresh(HashSet<String>);

impl Fresh {
    /// `name`, or the refusal of a model that already uses it.
    fn name(&self, name: &str) -> Result<String> {
        if self.0.contains(name) {
            Err(refused(&format!(
                "it already uses the name {name}, which the genai interface needs"
            )))
        } else {
            Ok(name.to_string())
        }
    }
}

/// The edit in progress: the model, the names it used before, the nodes to run before and
/// after the graph's own, and what the rank-4 state writes share.
struct Adapter<'m> {
    edit: ModelEdit<'m>,
    fresh: Fresh,
    batch: Dim,
    /// The state's rows (the model's maximum sequence).
    n: usize,
    before: Vec<Node>,
    after: Vec<Node>,
    /// The (b, 0, row) indices made from each (b, row) `ScatterND` indices tensor.
    indices4: BTreeMap<String, String>,
    /// The `[0, n, width]` reshape target of each state width.
    view_shapes: BTreeMap<usize, String>,
    uses_scatter_nd: bool,
    uses_tensor_scatter: bool,
}

impl Adapter<'_> {
    /// genai's `[batch, 1, n, width]` state shape.
    fn state_shape(&self, width: usize) -> Vec<Dim> {
        vec![
            self.batch.clone(),
            Dim::Fixed(1),
            Dim::Fixed(self.n),
            Dim::Fixed(width),
        ]
    }

    /// Replaces the `position` input with genai's `position_ids` (position =
    /// `position_ids[:, 0]`) and declares `attention_mask`.
    fn position_from_ids(&mut self) -> Result<()> {
        let position_ids = self.fresh.name(POSITION_IDS)?;
        let attention_mask = self.fresh.name(ATTENTION_MASK)?;
        let first = self.fresh.name("genai/first_position")?;
        let edit = &mut self.edit;
        edit.add_i64_scalar_initializer(&first, 0);
        edit.remove_input(POSITION);
        edit.add_input(
            &position_ids,
            DataType::Int64,
            &[self.batch.clone(), Dim::Symbol("sequence".into())],
        );
        edit.add_input(
            &attention_mask,
            DataType::Int64,
            &[self.batch.clone(), Dim::Symbol("total_sequence".into())],
        );
        self.before.push(gather_axis_node(
            "genai/position",
            &position_ids,
            &first,
            1,
            POSITION,
        ));
        Ok(())
    }

    /// The spare tensor `k` of `layer`: an input passed through to its output.
    fn spare(&mut self, layer: &GenaiLayer, k: usize, past4: &str, present4: &str) {
        let shape = self.state_shape(layer.width);
        self.edit.add_input(past4, DataType::Float, &shape);
        self.after.push(identity_node(
            &format!("genai/spare.{}.{k}", layer.index),
            past4,
            present4,
        ));
        self.edit.add_output(present4, DataType::Float, &shape);
    }

    /// Turns the built file's state `(past, present)` of `width` into genai's rank-4
    /// `(past4, present4)`: its scatter writes the rank-4 tensor, which becomes the graph
    /// output, and a `Reshape` gives the rest of the graph the view it read before.
    fn state(
        &mut self,
        names: &Constants,
        width: usize,
        (past, present): (&str, &str),
        (past4, present4): (&str, &str),
    ) -> Result<()> {
        let shape = self.state_shape(width);
        let scatter = self
            .edit
            .producer(present)
            .ok_or_else(|| refused(&format!("no node computes {present}")))?
            .clone();
        match scatter.op_type() {
            "ScatterND" => self.scatter_nd_rank4(names, &scatter, present)?,
            "TensorScatter" => self.tensor_scatter_rank4(names, &scatter, present)?,
            other => {
                return Err(refused(&format!(
                    "its state {past} is written by {other}, not a scatter"
                )))
            }
        }
        let view = self.view_shape(width)?;
        let edit = &mut self.edit;
        edit.rename_producer_output(present, present4);
        edit.insert_after(
            present4,
            &[reshape_node(
                &format!("{present}/genai_view"),
                present4,
                &view,
                present,
            )],
        );
        edit.remove_output(present);
        edit.add_output(present4, DataType::Float, &shape);
        edit.rename_input(past, past4);
        edit.set_input_shape(past4, &shape);
        Ok(())
    }

    /// Makes the `ScatterND` that computes `present` write at (b, 0, row): its indices
    /// get the head axis (made once per indices tensor).
    fn scatter_nd_rank4(
        &mut self,
        names: &Constants,
        scatter: &onnx::NodeProto,
        present: &str,
    ) -> Result<()> {
        let indices = scatter.input.get(1).cloned().unwrap_or_default();
        let i4 = match self.indices4.get(&indices) {
            Some(v) => v.clone(),
            None => {
                let v = self.fresh.name(&format!("{indices}/genai_head"))?;
                if !self
                    .edit
                    .insert_after(&indices, &names.head_indices(&indices, &v))
                {
                    return Err(refused(&format!(
                        "no node computes the scatter indices {indices}"
                    )));
                }
                self.indices4.insert(indices.clone(), v.clone());
                v
            }
        };
        self.edit.set_producer_input(present, 1, &i4);
        self.uses_scatter_nd = true;
        Ok(())
    }

    /// Makes the `TensorScatter` that computes `present` write along axis 2 an update with
    /// a new axis 1.
    fn tensor_scatter_rank4(
        &mut self,
        names: &Constants,
        scatter: &onnx::NodeProto,
        present: &str,
    ) -> Result<()> {
        let update = scatter.input.get(1).cloned().unwrap_or_default();
        let update4 = self.fresh.name(&format!("{update}/genai_head"))?;
        self.edit.insert_before(
            present,
            &[unsqueeze_node(
                &format!("{update}/genai_head"),
                &update,
                &names.head_axis,
                &update4,
            )],
        );
        self.edit.set_producer_input(present, 1, &update4);
        self.edit.set_producer_int_attribute(present, "axis", 2);
        self.uses_tensor_scatter = true;
        Ok(())
    }

    /// The initializer `[0, n, width]` that reshapes a rank-4 state of `width` to the
    /// built file's view (added once per width).
    fn view_shape(&mut self, width: usize) -> Result<String> {
        if let Some(v) = self.view_shapes.get(&width) {
            return Ok(v.clone());
        }
        let v = self
            .fresh
            .name(&format!("genai/state_view_shape_{width}"))?;
        self.edit
            .add_i64_initializer(&v, &[0, self.n as i64, width as i64]);
        self.view_shapes.insert(width, v.clone());
        Ok(v)
    }

    /// The added end token `id`: pads and the end token fed back as input read the last
    /// real row (`Min`), and the logits get one more entry, −∞.
    fn end_token(
        &mut self,
        names: &Constants,
        vocab: usize,
        id: i64,
        logits_type: DataType,
    ) -> Result<()> {
        // Pads and the end token fed back as input read the last real row.
        let last = self.fresh.name("genai/last_id")?;
        let ids = self.fresh.name("genai/input_ids_in_vocabulary")?;
        self.edit
            .add_i64_scalar_initializer(&last, vocab as i64 - 1);
        self.edit.redirect_reads(INPUT_IDS, &ids);
        self.before
            .push(min_node("genai/ids", INPUT_IDS, &last, &ids));
        // One more logit, −∞: the declared end token, never picked.
        let fresh = &self.fresh;
        let model_logits = fresh.name("genai/model_logits")?;
        let (first_logit, zero_logit, never) = (
            fresh.name("genai/first_logit")?,
            fresh.name("genai/zero_logit")?,
            fresh.name("genai/end_logit")?,
        );
        let (zero, minus_inf) = (fresh.name("genai/zero")?, fresh.name("genai/minus_inf")?);
        let edit = &mut self.edit;
        if !edit.add_float_scalar_initializer(&zero, logits_type, 0.0)
            || !edit.add_float_scalar_initializer(&minus_inf, logits_type, f32::NEG_INFINITY)
        {
            return Err(refused("its logits are neither float32 nor float16"));
        }
        edit.rename_producer_output(LOGITS, &model_logits);
        self.after.extend([
            slice_node(
                "genai/first_logit",
                &model_logits,
                &names.start0,
                &names.end1,
                &names.last_axis,
                &first_logit,
            ),
            mul_node("genai/zero_logit", &first_logit, &zero, &zero_logit),
            crate::onnx::edit::add_node("genai/end_logit", &zero_logit, &minus_inf, &never),
            concat_node("genai/logits", &[&model_logits, &never], 2, LOGITS),
        ]);
        edit.set_output_shape(
            LOGITS,
            &[
                self.batch.clone(),
                Dim::Symbol("sequence".into()),
                Dim::Fixed(id as usize + 1),
            ],
        );
        Ok(())
    }
}

/// The initializers the rank-4 writes share.
struct Constants {
    start0: String,
    end1: String,
    start1: String,
    end2: String,
    last_axis: String,
    head_axis: String,
    zero: String,
}

impl Constants {
    /// The constants' names, each refused if the model already uses it.
    fn new(fresh: &Fresh) -> Result<Constants> {
        Ok(Constants {
            start0: fresh.name("genai/start_0")?,
            end1: fresh.name("genai/end_1")?,
            start1: fresh.name("genai/start_1")?,
            end2: fresh.name("genai/end_2")?,
            last_axis: fresh.name("genai/axis_2")?,
            head_axis: fresh.name("genai/head_axis")?,
            zero: fresh.name("genai/zero_index")?,
        })
    }

    /// Adds the initializers the edit uses: those of [`Constants::head_indices`] for
    /// `ScatterND`, the new axis for `TensorScatter`, the first-logit slice for an added
    /// end token.
    fn add(&self, edit: &mut ModelEdit, scatter_nd: bool, tensor_scatter: bool, logit: bool) {
        if scatter_nd || logit {
            edit.add_i64_initializer(&self.start0, &[0]);
            edit.add_i64_initializer(&self.end1, &[1]);
            edit.add_i64_initializer(&self.last_axis, &[2]);
        }
        if scatter_nd {
            edit.add_i64_initializer(&self.start1, &[1]);
            edit.add_i64_initializer(&self.end2, &[2]);
            edit.add_i64_scalar_initializer(&self.zero, 0);
        }
        if tensor_scatter {
            edit.add_i64_initializer(&self.head_axis, &[1]);
        }
    }

    /// `ScatterND` indices (b, 0, row) `[batch, sequence, 3]` from (b, row) `indices`.
    fn head_indices(&self, indices: &str, output: &str) -> Vec<Node> {
        let b = format!("{output}/batch");
        let zero = format!("{output}/head");
        let row = format!("{output}/row");
        vec![
            slice_node(&b, indices, &self.start0, &self.end1, &self.last_axis, &b),
            mul_node(&zero, &b, &self.zero, &zero),
            slice_node(
                &row,
                indices,
                &self.start1,
                &self.end2,
                &self.last_axis,
                &row,
            ),
            concat_node(output, &[&b, &zero, &row], 2, output),
        ]
    }
}
