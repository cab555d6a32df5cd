//! Tests of the configuration plan and its names.

use super::*;
use crate::serve::triton::testing::{model, names_settings, tensor};

#[test]
fn variable_dimensions_become_minus_one() {
    let m = model(
        &[tensor("x", DataType::Float, &["batch", "sequence", "16"])],
        &[tensor("y", DataType::Float, &["batch", "sequence", "?"])],
    );
    let config = plan(&m, &TritonOptions::new("m")).unwrap();
    assert_eq!(config.inputs[0].dims, vec![-1, 16]);
    assert_eq!(config.outputs[0].dims, vec![-1, -1]);
}

#[test]
fn with_past_models_get_implicit_states_starting_empty() {
    let m = model(
        &[
            tensor("input_ids", DataType::Int64, &["batch", "sequence"]),
            tensor(
                "past_sgu.0",
                DataType::Float,
                &["batch", "past_sequence", "16"],
            ),
            tensor(
                "past_key.0",
                DataType::Float,
                &["batch", "past_sequence", "8"],
            ),
        ],
        &[
            tensor("logits", DataType::Float, &["batch", "sequence", "50"]),
            tensor(
                "present_sgu.0",
                DataType::Float,
                &["batch", "total_sequence", "16"],
            ),
            tensor(
                "present_key.0",
                DataType::Float,
                &["batch", "total_sequence", "8"],
            ),
        ],
    );
    let config = plan(&m, &TritonOptions::new("lm")).unwrap();
    assert_eq!(config.inputs.len(), 1);
    assert_eq!(config.outputs.len(), 1);
    assert_eq!(config.states.len(), 2);
    assert_eq!(config.states[0].input.dims, vec![-1, 16]);
    assert_eq!(config.states[1].output_name, "present_key.0");
    let text = config.to_pbtxt();
    assert!(text.contains("sequence_batching {"), "{text}");
    assert!(!text.contains("dynamic_batching"), "{text}");
    assert!(
        text.contains(
            "input_name: \"past_sgu.0\"\n      output_name: \"present_sgu.0\"\n      data_type: TYPE_FP32\n      dims: [ -1, 16 ]"
        ),
        "{text}"
    );
    assert!(
        text.contains("dims: [ 1, 16 ]\n        zero_data: true"),
        "{text}"
    );
    assert!(text.contains("max_batch_size: 1\n"), "{text}");
    assert!(text.contains("oldest {"), "{text}");
    let mut options = TritonOptions::new("lm");
    options.max_batch_size = Some(8);
    let e = plan(&m, &options).unwrap_err();
    assert!(names_settings(&e, &[Setting::StaticState]), "{e:?}");
}

#[test]
fn a_past_input_without_its_present_output_is_refused() {
    let m = model(
        &[
            tensor("input_ids", DataType::Int64, &["batch", "sequence"]),
            tensor(
                "past_sgu.0",
                DataType::Float,
                &["batch", "past_sequence", "16"],
            ),
        ],
        &[tensor(
            "logits",
            DataType::Float,
            &["batch", "sequence", "50"],
        )],
    );
    let e = plan(&m, &TritonOptions::new("lm")).unwrap_err();
    assert!(matches!(e, Error::Unservable(_)), "{e:?}");
}

#[test]
fn types_triton_cannot_carry_are_refused() {
    for (elem, name) in [
        (DataType::Undefined, "undefined"),
        (DataType::Complex64, "complex64"),
        (DataType::Bfloat16, "bfloat16"),
        (DataType::Float8e4m3fn, "float8"),
        (DataType::Uint2, "2-bit integer"),
        (DataType::Float6e2m3, "float6"),
    ] {
        let m = model(
            &[tensor("x", elem, &["batch", "4"])],
            &[tensor("y", DataType::Float, &["batch", "4"])],
        );
        let e = plan(&m, &TritonOptions::new("m")).unwrap_err();
        assert!(matches!(e, Error::Unservable(_)), "{e:?}");
        // The one test of this family's words: the message names the refused type, on
        // one line.
        let e = e.to_string();
        assert!(e.contains(&format!("({name})")), "{e}");
        assert!(!e.contains('\n'));
    }
    assert_eq!(
        triton_data_type(DataType::Float16 as i32),
        Some("TYPE_FP16")
    );
    assert_eq!(triton_data_type(DataType::Bool as i32), Some("TYPE_BOOL"));
}

#[test]
fn a_fixed_batch_dimension_needs_batching_off() {
    let m = model(
        &[tensor("x", DataType::Float, &["1", "4"])],
        &[tensor("y", DataType::Float, &["1", "4"])],
    );
    let e = plan(&m, &TritonOptions::new("m")).unwrap_err();
    assert!(names_settings(&e, &[Setting::TritonMaxBatchSize]), "{e:?}");
    let mut options = TritonOptions::new("m");
    options.max_batch_size = Some(0);
    assert_eq!(plan(&m, &options).unwrap().inputs[0].dims, vec![1, 4]);
}

#[test]
fn model_names() {
    for ok in ["gmlp", "gmlp-ti16", "a.b_c-1", "_x"] {
        check_model_name(ok).unwrap();
    }
    for bad in [
        "",
        ".hidden",
        "-x",
        "a/b",
        "a b",
        "ü",
        "a?b",
        "..",
        &"x".repeat(129),
    ] {
        assert!(check_model_name(bad).is_err(), "{bad:?} accepted");
    }
    let mut options = TritonOptions::new("m");
    options.version = 0;
    assert!(options.check().is_err());
}
