//! Which ONNX opsets the builder targets, and the IR version each one is written with.
//!
//! The IR version is the one ONNX's release table pairs with the opset:
//! `onnx.helper.VERSION_TABLE` in onnx 1.23.2 (rows `(release, ir_version, ai.onnx opset,
//! ...)`; the IR version of the first release that shipped the opset, which is also what
//! `onnx.helper.find_min_ir_version_for` returns). A higher IR version than the opset
//! needs locks out runtimes that predate it for no gain: ONNX Runtime ≤ 1.14 refuses IR 9,
//! so an opset-17 file written as IR 9 does not load there, while the same file as IR 8
//! does.

use std::ops::RangeInclusive;

/// Lowest and highest `ai.onnx` opset the builder can target.
pub const OPSET_RANGE: RangeInclusive<i64> = 13..=24;

/// `(opset, IR version)` for every opset in [`OPSET_RANGE`], from
/// `onnx.helper.VERSION_TABLE` (onnx 1.23.2): onnx 1.8/1.9 (opsets 13, 14) shipped IR 7,
/// 1.10–1.13 (opsets 15–18) IR 8, 1.14/1.15 (opsets 19, 20) IR 9, 1.16/1.17 (opsets 21,
/// 22) IR 10, 1.18 (opset 23) IR 11, 1.19 (opset 24) IR 12. Opsets 22–24 change none of
/// the operators the builder emits except by adding element types (Conv 22; Reshape,
/// Transpose, Shape, Cast, Pad, Constant, Unsqueeze, Squeeze 23 and 24); opset 24 adds
/// `TensorScatter`, which the static state form uses (docs/static-state.md).
pub const IR_VERSION_TABLE: [(i64, i64); 12] = [
    (13, 7),
    (14, 7),
    (15, 8),
    (16, 8),
    (17, 8),
    (18, 8),
    (19, 9),
    (20, 9),
    (21, 10),
    (22, 10),
    (23, 11),
    (24, 12),
];

/// The IR version written for `opset`: the release table's pairing ([`IR_VERSION_TABLE`]).
/// Opsets outside the table (refused by the builder before anything is written) get the
/// IR version of the nearest end of the table.
pub fn ir_version_for(opset: i64) -> i64 {
    let (first, last) = (
        IR_VERSION_TABLE[0],
        IR_VERSION_TABLE[IR_VERSION_TABLE.len() - 1],
    );
    IR_VERSION_TABLE
        .iter()
        .find(|(o, _)| *o == opset)
        .map(|(_, ir)| *ir)
        .unwrap_or(if opset < first.0 { first.1 } else { last.1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_covers_the_opset_range_in_order() {
        let opsets: Vec<i64> = IR_VERSION_TABLE.iter().map(|(o, _)| *o).collect();
        assert_eq!(opsets, OPSET_RANGE.collect::<Vec<_>>());
        // IR versions never decrease with the opset.
        assert!(IR_VERSION_TABLE.windows(2).all(|w| w[0].1 <= w[1].1));
    }

    #[test]
    fn ir_versions_follow_the_release_table() {
        let got: Vec<i64> = (13..=24).map(ir_version_for).collect();
        assert_eq!(got, vec![7, 7, 8, 8, 8, 8, 9, 9, 10, 10, 11, 12]);
        // ONNX Runtime 1.14 reads IR ≤ 8: the default opset 17 must be IR 8.
        assert_eq!(ir_version_for(17), 8);
    }
}
