//! The with-past state adapter (see the module doc of [`super`] for why Triton r24.10
//! needs it), made with the in-place edits of [`crate::onnx::edit`].

use std::collections::BTreeMap;

use super::config::ImplicitState;
use super::invalid;
use crate::error::Result;
use crate::onnx::edit::{concat_node, slice_node, ModelEdit};
use crate::onnx::proto as onnx;

/// Name of the metadata property that marks a model adapted by [`adapt_with_past`].
pub const ADAPTER_METADATA_KEY: &str = "gmlp_onnx.triton_state_slot";

/// Puts a with-past model behind the state adapter Triton r24.10 needs (see [the module
/// doc](super)): each state input `past_X` now carries one leading slot along its sequence axis,
/// which a `Slice` removes before the original graph sees `past_X`; the original
/// `present_X` gets the same slot back in front by a `Concat`. Starting from Triton's
/// one-slot zero `initial_state`, the model therefore sees an empty past on the first
/// request and exactly its own `present_X` afterwards.
pub fn adapt_with_past(model: &mut onnx::ModelProto, states: &[ImplicitState]) -> Result<()> {
    let mut edit = ModelEdit::new(model).ok_or_else(|| invalid("the model has no graph"))?;
    let taken = edit.value_names();
    let fresh = |base: String| -> Result<String> {
        if taken.contains(&base) {
            Err(invalid(format!(
                "the model already uses the name {base}, which the Triton state adapter needs"
            )))
        } else {
            Ok(base)
        }
    };
    if edit.has_subgraphs() {
        return Err(invalid(
            "the Triton state adapter does not handle models with subgraphs (If, Loop, Scan)",
        ));
    }
    let mut front = Vec::new();
    let mut back = Vec::new();
    let mut constants = BTreeMap::new();
    for s in states {
        // Fixed-size (static) states need no slot: their initial state is the whole state.
        let Some(sequence_axis) = s.sequence_axis else {
            continue;
        };
        let past = s.input.name.as_str();
        let present = s.output_name.as_str();
        let axis = i64::try_from(sequence_axis).unwrap_or(i64::MAX);
        let inner_past = fresh(format!("{past}/triton_without_slot"))?;
        let slot = fresh(format!("{past}/triton_slot"))?;
        let inner_present = fresh(format!("{present}/triton_without_slot"))?;
        if !edit.is_computed(present) {
            return Err(invalid(format!(
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
    use crate::onnx::dtype::DataType;
    use crate::onnx::graph::{Dim, Node};
    use crate::onnx::reader::{declared_inputs, metadata_value};
    use crate::serve::triton::testing::{model, tensor};
    use crate::serve::triton::{plan, TritonOptions};

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
