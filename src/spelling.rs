//! How an enum value is spelled where users see it. The library's enums that users choose
//! on the command line derive clap's `ValueEnum`, so the enum is the one definition of its
//! spellings (kebab-case of the variant names), its `--help` lines (each variant's first
//! doc paragraph) and its set of values; those that are also written to JSON derive serde
//! with `rename_all = "kebab-case"`, the same spelling (tests/suite/spellings.rs checks
//! that every variant agrees).

use clap::ValueEnum;

/// The command-line spelling of `value`, which is also its metadata and JSON spelling.
/// (Empty only for a variant marked `#[value(skip)]`, which no enum of this crate has.)
pub fn spelling<E: ValueEnum>(value: &E) -> String {
    value
        .to_possible_value()
        .map_or_else(String::new, |v| v.get_name().to_string())
}
