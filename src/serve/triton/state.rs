//! The adapters a with-past model is served behind (see the module doc of [`super`] for
//! why), made with the in-place edits of [`crate::onnx::edit`]: the one-slot state of the
//! growing form ([`adapt_with_past`]) and the position counter of the static form
//! ([`add_position_counter`]).

use std::collections::{BTreeMap, HashSet};

use super::config::{ImplicitState, StateKind, NEXT_POSITION};
use super::unservable;
use crate::error::Result;
use crate::gmlp::emit::INPUT_IDS;
use crate::onnx::dtype::DataType;
use crate::onnx::edit::{
    add_node, concat_node, gather_node, reshape_node, shape_node, slice_node, ModelEdit,
};
use crate::onnx::graph::Dim;
use crate::onnx::proto as onnx;
use crate::onnx::reader::declared_inputs;

/// Name of the metadata property that marks a model adapted by [`adapt_with_past`].
pub const ADAPTER_METADATA_KEY: &str = "gmlp_onnx.triton_state_slot";
/// Name of the metadata property that marks a model given the counter of
/// [`add_position_counter`].
pub const COUNTER_METADATA_KEY: &str = "gmlp_onnx.triton_position_counter";

/// A name the adapter adds, refused when the model already uses it.
fn fresh(taken: &HashSet<String>, name: String) -> Result<String> {
    if taken.contains(&name) {
        Err(unservable(format!(
            "the model already uses the name {name}, which the Triton state adapter needs"
        )))
    } else {
        Ok(name)
    }
}

/// Lets Triton keep a static-state model's `position` (see [the module doc](super)): the
/// state whose kind is [`StateKind::Position`] (the model's `position` input, int64
/// `[batch]`) is declared `[batch, 1]`, the shape of a Triton state of dims `[ 1 ]` (a
/// state of dims `[ ]` gets no bytes: "not enough space: expected 8, got 0"), and reshaped
/// to `[batch]` for the model; the new output [`NEXT_POSITION`] `[batch, 1]`, `position`
/// plus the request's token count (`Shape(input_ids)[1]`), is what Triton feeds back as
/// the next request's `position`, starting from 0 on the sequence's start flag. One node
/// before the graph's own, three after, two initializers; the model's nodes and weights
/// are untouched.
pub fn add_position_counter(model: &mut onnx::ModelProto, states: &[ImplicitState]) -> Result<()> {
    let Some(state) = states.iter().find(|s| s.kind == StateKind::Position) else {
        return Ok(());
    };
    let position = state.input.name.as_str();
    let batch = declared_inputs(model)
        .into_iter()
        .find(|t| t.name == position)
        .and_then(|t| t.shape.into_iter().next())
        .ok_or_else(|| unservable(format!("the model has no input {position}")))?;
    let mut edit = ModelEdit::new(model).ok_or_else(|| unservable("the model has no graph"))?;
    let taken = edit.value_names();
    let flat = fresh(&taken, format!("{position}/triton_flat"))?;
    let flat_shape = fresh(&taken, "triton_position/flat_shape".into())?;
    let shape = fresh(&taken, "triton_position/tokens_shape".into())?;
    let axis = fresh(&taken, "triton_position/sequence_axis".into())?;
    let tokens = fresh(&taken, "triton_position/tokens".into())?;
    let next = fresh(&taken, NEXT_POSITION.into())?;
    edit.redirect_reads(position, &flat);
    edit.add_i64_initializer(&flat_shape, &[-1]);
    edit.add_i64_initializer(&axis, &[1]);
    edit.wrap_nodes(
        &[reshape_node(
            "triton_position/flatten",
            position,
            &flat_shape,
            &flat,
        )],
        &[
            shape_node("triton_position/shape", INPUT_IDS, &shape),
            gather_node("triton_position/count", &shape, &axis, &tokens),
            add_node("triton_position/advance", position, &tokens, &next),
        ],
    );
    let column = [batch, Dim::Fixed(1)];
    edit.set_input_shape(position, &column);
    edit.add_output(&next, DataType::Int64, &column);
    edit.add_metadata(
        COUNTER_METADATA_KEY,
        "position [batch, 1] is Triton's implicit state; triton_next_position = position + tokens of the request",
    );
    Ok(())
}

/// Puts a with-past model behind the state adapter Triton r24.10 needs (see [the module
/// doc](super)): each state input `past_X` now carries one leading slot along its sequence axis,
/// which a `Slice` removes before the original graph sees `past_X`; the original
/// `present_X` gets the same slot back in front by a `Concat`. Starting from Triton's
/// one-slot zero `initial_state`, the model therefore sees an empty past on the first
/// request and exactly its own `present_X` afterwards.
pub fn adapt_with_past(model: &mut onnx::ModelProto, states: &[ImplicitState]) -> Result<()> {
    let mut edit = ModelEdit::new(model).ok_or_else(|| unservable("the model has no graph"))?;
    let taken = edit.value_names();
    let fresh = |base: String| fresh(&taken, base);
    if edit.has_subgraphs() {
        return Err(unservable(
            "the Triton state adapter does not handle models with subgraphs (If, Loop, Scan)",
        ));
    }
    let mut front = Vec::new();
    let mut back = Vec::new();
    let mut constants = BTreeMap::new();
    for s in states {
        // Fixed-size (static) states need no slot: their initial state is the whole state.
        let Some(sequence_axis) = s.sequence_axis() else {
            continue;
        };
        let past = s.input.name.as_str();
        let present = s.output_name.as_str();
        let axis = i64::try_from(sequence_axis).unwrap_or(i64::MAX);
        let inner_past = fresh(format!("{past}/triton_without_slot"))?;
        let slot = fresh(format!("{past}/triton_slot"))?;
        let inner_present = fresh(format!("{present}/triton_without_slot"))?;
        if !edit.is_computed(present) {
            return Err(unservable(format!(
                "output {present} is not computed by a node, so the Triton state adapter cannot wrap it"
            )));
        }
        edit.redirect_reads(past, &inner_past);
        edit.rename_computed(present, &inner_present);
        let zero = "triton_state/zero".to_string();
        let one = "triton_state/one".to_string();
        let end = "triton_state/end".to_string();
        let axis_name = format!("triton_state/axis{axis}");
        constants.insert(zero.clone(), 0);
        constants.insert(one.clone(), 1);
        constants.insert(end.clone(), i64::MAX);
        constants.insert(axis_name.clone(), axis);
        front.push(slice_node(
            &format!("{past}/triton_drop_slot"),
            past,
            &one,
            &end,
            &axis_name,
            &inner_past,
        ));
        front.push(slice_node(
            &format!("{past}/triton_keep_slot"),
            past,
            &zero,
            &one,
            &axis_name,
            &slot,
        ));
        back.push(concat_node(
            &format!("{present}/triton_put_slot_back"),
            &[&slot, &inner_present],
            axis,
            present,
        ));
        edit.set_input_dim(past, sequence_axis, "triton_state_sequence");
        edit.set_output_dim(present, sequence_axis, "triton_state_total_sequence");
    }
    for (name, value) in constants {
        fresh(name.clone())?;
        edit.add_i64_initializer(&name, &[value]);
    }
    edit.wrap_nodes(&front, &back);
    edit.add_metadata(
        ADAPTER_METADATA_KEY,
        "past_* inputs and present_* outputs carry one leading zero slot for Triton's implicit state",
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::onnx::dtype::DataType;
    use crate::onnx::graph::Node;
    use crate::onnx::reader::{declared_inputs, declared_outputs, metadata_value};
    use crate::serve::triton::testing::{model, tensor};
    use crate::serve::triton::{plan, TritonOptions};

    #[test]
    fn the_position_counter_adds_the_request_tokens_to_the_position() {
        let mut m = model(
            &[
                tensor("input_ids", DataType::Int64, &["batch", "sequence"]),
                tensor("position", DataType::Int64, &["batch"]),
                tensor("past_sgu.0", DataType::Float, &["batch", "8", "4"]),
            ],
            &[
                tensor("logits", DataType::Float, &["batch", "sequence", "11"]),
                tensor("present_sgu.0", DataType::Float, &["batch", "8", "4"]),
            ],
        );
        let own = Node {
            name: "write".into(),
            op_type: "ScatterND".into(),
            inputs: vec!["past_sgu.0".into(), "position".into(), "x".into()],
            outputs: vec!["present_sgu.0".into()],
            attributes: vec![],
            flops: 0,
        };
        ModelEdit::new(&mut m).unwrap().wrap_nodes(&[], &[own]);
        let before = m.clone();
        let config = plan(&m, &TritonOptions::new("lm")).unwrap();
        add_position_counter(&mut m, &config.states).unwrap();
        let g = m.graph.as_ref().unwrap();
        let ops: Vec<(&str, Vec<&str>, Vec<&str>)> = g
            .node
            .iter()
            .map(|n| {
                (
                    n.op_type(),
                    n.input.iter().map(String::as_str).collect(),
                    n.output.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            ops,
            vec![
                (
                    "Reshape",
                    vec!["position", "triton_position/flat_shape"],
                    vec!["position/triton_flat"]
                ),
                (
                    "ScatterND",
                    vec!["past_sgu.0", "position/triton_flat", "x"],
                    vec!["present_sgu.0"]
                ),
                (
                    "Shape",
                    vec!["input_ids"],
                    vec!["triton_position/tokens_shape"]
                ),
                (
                    "Gather",
                    vec![
                        "triton_position/tokens_shape",
                        "triton_position/sequence_axis"
                    ],
                    vec!["triton_position/tokens"]
                ),
                (
                    "Add",
                    vec!["position", "triton_position/tokens"],
                    vec![NEXT_POSITION]
                ),
            ]
        );
        // The model's own node reads the flattened position; its weights and outputs are
        // untouched; `position` becomes [batch, 1] like the output added beside it.
        let before_g = before.graph.as_ref().unwrap();
        assert_eq!(g.node[1].op_type, before_g.node[0].op_type);
        assert_eq!(g.output[..2], before_g.output[..]);
        let column = vec![Dim::Symbol("batch".into()), Dim::Fixed(1)];
        assert_eq!(declared_inputs(&m)[1].shape, column);
        let added = &declared_outputs(&m)[2];
        assert_eq!(added.name, NEXT_POSITION);
        assert_eq!(added.elem_type, DataType::Int64 as i32);
        assert_eq!(added.shape, column);
        let constants: Vec<(&str, &[i64])> = g
            .initializer
            .iter()
            .map(|t| (t.name(), t.int64_data.as_slice()))
            .collect();
        assert_eq!(
            constants,
            [
                ("triton_position/flat_shape", &[-1][..]),
                ("triton_position/sequence_axis", &[1][..])
            ]
        );
        assert!(metadata_value(&m, COUNTER_METADATA_KEY).is_some());
        // A second counter needs names the first one took.
        let e = add_position_counter(&mut m, &config.states).unwrap_err();
        assert!(matches!(e, Error::Unservable(_)), "{e:?}");
    }

    #[test]
    fn the_state_adapter_slices_the_slot_off_and_puts_it_back() {
        let mut m = model(
            &[
                tensor("input_ids", DataType::Int64, &["batch", "sequence"]),
                tensor(
                    "past_sgu.0",
                    DataType::Float,
                    &["batch", "past_sequence", "4"],
                ),
            ],
            &[
                tensor("logits", DataType::Float, &["batch", "sequence", "11"]),
                tensor(
                    "present_sgu.0",
                    DataType::Float,
                    &["batch", "total_sequence", "4"],
                ),
            ],
        );
        // present_sgu.0 = Concat(past_sgu.0, x); logits = ReduceSum(present_sgu.0).
        let reduce = Node {
            name: "use".into(),
            op_type: "ReduceSum".into(),
            inputs: vec!["present_sgu.0".into()],
            outputs: vec!["logits".into()],
            attributes: vec![],
            flops: 0,
        };
        let cat = concat_node("cat", &["past_sgu.0", "x"], 1, "present_sgu.0");
        ModelEdit::new(&mut m)
            .unwrap()
            .wrap_nodes(&[], &[cat, reduce]);
        let config = plan(&m, &TritonOptions::new("lm")).unwrap();
        adapt_with_past(&mut m, &config.states).unwrap();
        let g = m.graph.as_ref().unwrap();
        let ops: Vec<(&str, Vec<&str>, Vec<&str>)> = g
            .node
            .iter()
            .map(|n| {
                (
                    n.op_type(),
                    n.input.iter().map(String::as_str).collect(),
                    n.output.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        let axis = "triton_state/axis1";
        assert_eq!(
            ops,
            vec![
                (
                    "Slice",
                    vec!["past_sgu.0", "triton_state/one", "triton_state/end", axis],
                    vec!["past_sgu.0/triton_without_slot"]
                ),
                (
                    "Slice",
                    vec!["past_sgu.0", "triton_state/zero", "triton_state/one", axis],
                    vec!["past_sgu.0/triton_slot"]
                ),
                (
                    "Concat",
                    vec!["past_sgu.0/triton_without_slot", "x"],
                    vec!["present_sgu.0/triton_without_slot"]
                ),
                (
                    "ReduceSum",
                    vec!["present_sgu.0/triton_without_slot"],
                    vec!["logits"]
                ),
                (
                    "Concat",
                    vec![
                        "past_sgu.0/triton_slot",
                        "present_sgu.0/triton_without_slot"
                    ],
                    vec!["present_sgu.0"]
                ),
            ]
        );
        let constants: Vec<(&str, i64)> = g
            .initializer
            .iter()
            .map(|t| (t.name(), t.int64_data[0]))
            .collect();
        assert!(constants.contains(&("triton_state/axis1", 1)));
        assert!(constants.contains(&("triton_state/end", i64::MAX)));
        assert_eq!(g.node[4].attribute[0].i, Some(1));
        // The graph's interface keeps its names; the state dimension gets a new symbol.
        let inputs = declared_inputs(&m);
        assert_eq!(
            inputs[1].shape[1],
            Dim::Symbol("triton_state_sequence".into())
        );
        assert!(metadata_value(&m, ADAPTER_METADATA_KEY).is_some());
    }
}
