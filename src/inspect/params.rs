//! How `inspect` counts parameters when some are stored quantized.
//!
//! A file's initializers hold three kinds of values:
//! - **parameters**: the model's own values, each counted once in its logical shape. A float
//!   initializer is a parameter (or a column slice of one); an integer weight is the
//!   quantized form of a parameter and counts as that parameter. The parameter count of an
//!   int8 file therefore equals its f32 file's.
//! - **quantized copies**: an integer weight whose parameter is also stored exactly as float
//!   (the int8 vocabulary head of a tied embedding, beside the f32 table that the input
//!   `Gather` reads). Stored, but not a second parameter.
//! - **quantization scales**: per-channel scales and zero points of integer weights.
//!
//! Integer weights are recognized by name, in the forms that occur: ours (`P.int8` with
//! `P.scale`, and `P.int4`, two 4-bit codes per byte, with its block scales `P.scale`; see
//! [`crate::gmlp::emit`]'s linear layers) and ONNX Runtime's `quantize_dynamic`
//! (`P_quantized` with `P_scale` and `P_zero_point`). The parameter a
//! weight stands for is its name less those suffixes and less the `.transposed` and
//! `.cols{a}_{b}` (column slice) suffixes of our files. When the file records its
//! configuration, the parameter's logical size comes from it (an int8 Toeplitz spatial
//! weight is stored as its expanded `[n, n]` matrix but is a `[2n − 1]` parameter);
//! otherwise the stored integer values are counted.

use std::collections::{BTreeMap, BTreeSet};

/// What one initializer is to the parameter count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A float parameter (or a slice of one).
    Float,
    /// An integer (int8/uint8) weight standing for a parameter.
    QuantizedWeight,
    /// A scale or zero point of an integer weight.
    QuantizationScale,
    /// Any other initializer (e.g. an integer index table): counted in stored values only.
    Other,
}

/// One initializer as the counter sees it.
#[derive(Clone, Debug)]
pub struct Stored<'a> {
    /// Initializer name.
    pub name: &'a str,
    /// Whether its element type is a float type.
    pub is_float: bool,
    /// Whether its element type is int8 or uint8.
    pub is_int8: bool,
    /// Number of elements.
    pub elements: u64,
    /// Bytes it occupies.
    pub bytes: u64,
}

/// The counts `inspect` reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParameterCounts {
    /// Model parameters, each once in its logical shape.
    pub parameters: u64,
    /// Bytes of the initializers that hold parameters (float and integer weights, as stored).
    pub parameter_bytes: u64,
    /// Values of integer weights (the parameters stored quantized, as stored; a packed
    /// 4-bit byte counts as its two codes).
    pub quantized_values: u64,
    /// Elements of integer copies of parameters that are also stored as float (tied heads).
    pub quantized_copy_values: u64,
    /// Names of the parameters that have such a copy.
    pub quantized_copies_of: Vec<String>,
    /// Elements of scales and zero points of integer weights.
    pub quantization_scale_values: u64,
    /// Elements of all initializers.
    pub stored_values: u64,
}

/// `name` without `suffix`, if it ends with it.
fn strip<'a>(name: &'a str, suffix: &str) -> Option<&'a str> {
    name.strip_suffix(suffix).filter(|s| !s.is_empty())
}

/// The parameter an initializer name stands for: less `.transposed` and a trailing
/// `.cols{a}_{b}` column slice.
pub fn parameter_of(name: &str) -> &str {
    let name = name.strip_suffix(".transposed").unwrap_or(name);
    if let Some((base, slice)) = name.rsplit_once(".cols") {
        let is_range = slice
            .split_once('_')
            .is_some_and(|(a, b)| is_number(a) && is_number(b));
        if is_range && !base.is_empty() {
            return base;
        }
    }
    name
}

fn is_number(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// The role of every initializer, by name and type (see the module documentation).
pub fn roles(stored: &[Stored]) -> Vec<Role> {
    let names: BTreeSet<&str> = stored.iter().map(|s| s.name).collect();
    let mut scales: BTreeSet<String> = BTreeSet::new();
    let mut weights: BTreeSet<&str> = BTreeSet::new();
    for s in stored.iter().filter(|s| s.is_int8) {
        if let Some(p) = strip(s.name, ".int8").or_else(|| strip(s.name, ".int4")) {
            if names.contains(format!("{p}.scale").as_str()) {
                weights.insert(s.name);
                scales.insert(format!("{p}.scale"));
            }
        } else if let Some(p) = strip(s.name, "_quantized") {
            if names.contains(format!("{p}_scale").as_str()) {
                weights.insert(s.name);
                scales.insert(format!("{p}_scale"));
                scales.insert(format!("{p}_zero_point"));
            }
        }
    }
    stored
        .iter()
        .map(|s| {
            if weights.contains(s.name) {
                Role::QuantizedWeight
            } else if scales.contains(s.name) {
                Role::QuantizationScale
            } else if s.is_float {
                Role::Float
            } else {
                Role::Other
            }
        })
        .collect()
}

/// The parameter a quantized weight stands for.
fn quantized_parameter(name: &str) -> &str {
    let p = strip(name, ".int8")
        .or_else(|| strip(name, ".int4"))
        .or_else(|| strip(name, "_quantized"))
        .unwrap_or(name);
    parameter_of(p)
}

/// Counts parameters, quantized values, copies and scales. `logical_size` gives a
/// parameter's size from the recorded configuration, when there is one.
pub fn count(stored: &[Stored], logical_size: impl Fn(&str) -> Option<u64>) -> ParameterCounts {
    let roles = roles(stored);
    let mut c = ParameterCounts::default();
    let float_params: BTreeSet<&str> = stored
        .iter()
        .zip(&roles)
        .filter(|(_, r)| **r == Role::Float)
        .map(|(s, _)| parameter_of(s.name))
        .collect();
    // Quantized parameters: stored values per parameter, to count each parameter once.
    let mut quantized: BTreeMap<&str, u64> = BTreeMap::new();
    let mut copies: BTreeSet<&str> = BTreeSet::new();
    for (s, role) in stored.iter().zip(&roles) {
        c.stored_values = c.stored_values.saturating_add(s.elements);
        match role {
            Role::Float => {
                c.parameters = c.parameters.saturating_add(s.elements);
                c.parameter_bytes = c.parameter_bytes.saturating_add(s.bytes);
            }
            Role::QuantizedWeight => {
                let p = quantized_parameter(s.name);
                // Values as codes: a packed `.int4` byte holds two.
                let codes = if s.name.ends_with(".int4") {
                    s.elements.saturating_mul(2)
                } else {
                    s.elements
                };
                if float_params.contains(p) {
                    c.quantized_copy_values = c.quantized_copy_values.saturating_add(codes);
                    copies.insert(p);
                } else {
                    c.quantized_values = c.quantized_values.saturating_add(codes);
                    c.parameter_bytes = c.parameter_bytes.saturating_add(s.bytes);
                    let e = quantized.entry(p).or_insert(0);
                    *e = e.saturating_add(codes);
                }
            }
            Role::QuantizationScale => {
                c.quantization_scale_values =
                    c.quantization_scale_values.saturating_add(s.elements);
            }
            Role::Other => {}
        }
    }
    for (p, stored_values) in quantized {
        let n = logical_size(p).unwrap_or(stored_values);
        c.parameters = c.parameters.saturating_add(n);
    }
    c.quantized_copies_of = copies.into_iter().map(str::to_string).collect();
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32(name: &str, elements: u64) -> Stored<'_> {
        Stored {
            name,
            is_float: true,
            is_int8: false,
            elements,
            bytes: 4 * elements,
        }
    }

    fn i8(name: &str, elements: u64) -> Stored<'_> {
        Stored {
            name,
            is_float: false,
            is_int8: true,
            elements,
            bytes: elements,
        }
    }

    #[test]
    fn parameter_names_lose_slice_and_transpose_suffixes() {
        assert_eq!(
            parameter_of("blocks.0.proj_in.weight.cols0_1536"),
            "blocks.0.proj_in.weight"
        );
        assert_eq!(
            parameter_of("blocks.0.sgu.spatial.weight.transposed"),
            "blocks.0.sgu.spatial.weight"
        );
        assert_eq!(parameter_of("embed.weight"), "embed.weight");
        // Not a column range: kept.
        assert_eq!(parameter_of("a.colsx_1"), "a.colsx_1");
        assert_eq!(parameter_of(".cols0_1"), ".cols0_1");
        assert_eq!(quantized_parameter("w.cols0_4_quantized"), "w");
        assert_eq!(
            quantized_parameter("embed.weight.transposed.int8"),
            "embed.weight"
        );
    }

    #[test]
    fn an_int8_file_counts_the_parameters_of_its_f32_file() {
        // f32: a [4, 6] weight in two column halves, a bias, a tied [10, 4] embedding, a
        // Toeplitz spatial weight of 2n − 1 = 7 values (n = 4).
        let f32_file = [
            f32("embed.weight", 40),
            f32("w.cols0_3", 12),
            f32("w.cols3_6", 12),
            f32("b", 6),
            f32("spatial.weight", 7),
        ];
        let full = count(&f32_file, |_| None);
        assert_eq!(full.parameters, 77);
        assert_eq!(full.stored_values, 77);
        assert_eq!(full.parameter_bytes, 4 * 77);
        // int8: the halves quantized, the spatial weight expanded to [4, 4], the embedding
        // kept in f32 with an int8 transposed copy for the head.
        let int8_file = [
            f32("embed.weight", 40),
            f32("w.cols0_3.scale", 3),
            i8("w.cols0_3.int8", 12),
            f32("w.cols3_6.scale", 3),
            i8("w.cols3_6.int8", 12),
            f32("b", 6),
            f32("spatial.weight.transposed.scale", 4),
            i8("spatial.weight.transposed.int8", 16),
            f32("embed.weight.transposed.scale", 10),
            i8("embed.weight.transposed.int8", 40),
        ];
        let logical = |p: &str| match p {
            "w" => Some(24),
            "spatial.weight" => Some(7),
            _ => None,
        };
        let q = count(&int8_file, logical);
        assert_eq!(q.parameters, full.parameters);
        assert_eq!(q.quantized_values, 12 + 12 + 16);
        assert_eq!(q.quantized_copy_values, 40);
        assert_eq!(q.quantized_copies_of, vec!["embed.weight".to_string()]);
        assert_eq!(q.quantization_scale_values, 3 + 3 + 4 + 10);
        assert_eq!(q.stored_values, 40 + 3 + 12 + 3 + 12 + 6 + 4 + 16 + 10 + 40);
        assert_eq!(q.parameter_bytes, 4 * (40 + 6) + 12 + 12 + 16);
        // Without a configuration the expanded spatial matrix counts as stored.
        assert_eq!(count(&int8_file, |_| None).parameters, 77 - 7 + 16);
    }

    #[test]
    fn an_int4_file_counts_codes_and_the_parameters_of_its_f32_file() {
        // The [4, 6] weight's halves as MatMulNBits blocks: N = 3 columns, one block of 32
        // (K = 4 padded), 16 bytes per block; the head an int8 copy of the embedding.
        let int4_file = [
            f32("embed.weight", 40),
            f32("w.cols0_3.scale", 3),
            i8("w.cols0_3.int4", 48),
            f32("w.cols3_6.scale", 3),
            i8("w.cols3_6.int4", 48),
            f32("b", 6),
            f32("spatial.weight", 7),
            f32("embed.weight.transposed.scale", 10),
            i8("embed.weight.transposed.int8", 40),
        ];
        let logical = |p: &str| (p == "w").then_some(24);
        let q = count(&int4_file, logical);
        assert_eq!(q.parameters, 77);
        assert_eq!(q.quantized_values, 2 * (48 + 48));
        assert_eq!(q.quantized_copies_of, vec!["embed.weight".to_string()]);
        assert_eq!(q.quantization_scale_values, 3 + 3 + 10);
        assert_eq!(q.parameter_bytes, 4 * (40 + 6 + 7) + 48 + 48);
    }

    #[test]
    fn onnx_runtime_quantize_dynamic_names_are_recognized() {
        let file = [
            f32("embed.weight", 40),
            i8("w_quantized", 24),
            f32("w_scale", 6),
            i8("w_zero_point", 6),
            f32("b", 6),
        ];
        assert_eq!(
            roles(&file),
            vec![
                Role::Float,
                Role::QuantizedWeight,
                Role::QuantizationScale,
                Role::QuantizationScale,
                Role::Float
            ]
        );
        let c = count(&file, |_| None);
        assert_eq!(c.parameters, 40 + 24 + 6);
        assert_eq!(c.quantization_scale_values, 12);
    }

    #[test]
    fn int8_tensors_without_a_scale_are_not_weights() {
        // An unpaired `.int8` name is just some other initializer.
        let file = [i8("x.int8", 5), f32("y", 2)];
        assert_eq!(roles(&file), vec![Role::Other, Role::Float]);
        let c = count(&file, |_| None);
        assert_eq!((c.parameters, c.stored_values), (2, 7));
    }
}
