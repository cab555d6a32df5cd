//! One spelling per enum value (src/spelling.rs): the library's enums that users choose on
//! the command line derive clap's `ValueEnum`, and those also written to JSON (the
//! configuration in a model's metadata, reports) derive serde with kebab-case names. Every
//! variant must be spelled alike by both, so a value read back from a file is the value a
//! user typed.

use clap::ValueEnum;
use serde::Serialize;

use gmlp_onnx::gmlp::targets::Target;
use gmlp_onnx::gmlp::{GateAct, InitScheme, Precision, SpatialForm};
use gmlp_onnx::spelling::spelling;

/// Checks every variant of `E`: clap's spelling is serde's, and clap parses it back to the
/// same variant. (The spellings themselves are pinned by docs/cli.md, which lists every
/// value of every enum flag and is checked against the binary.)
fn assert_spelled_alike<E: ValueEnum + Serialize + PartialEq + std::fmt::Debug>() {
    let what = std::any::type_name::<E>();
    assert!(!E::value_variants().is_empty(), "{what}");
    for v in E::value_variants() {
        let cli = spelling(v);
        let json = serde_json::to_value(v).expect("serialize a unit variant");
        assert_eq!(
            json,
            serde_json::Value::String(cli.clone()),
            "{what}::{v:?}"
        );
        assert_eq!(E::from_str(&cli, false).as_ref(), Ok(v), "{what}: {cli}");
    }
}

#[test]
fn every_enum_value_is_spelled_alike_on_the_command_line_and_in_json() {
    assert_spelled_alike::<SpatialForm>();
    assert_spelled_alike::<Precision>();
    assert_spelled_alike::<InitScheme>();
    assert_spelled_alike::<GateAct>();
    assert_spelled_alike::<Target>();
}
