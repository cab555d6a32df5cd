//! docs/cli.md, the command-line reference, is generated from the clap definitions of this
//! module's parent by [clap-markdown](https://docs.rs/clap-markdown) (the same text
//! `--help` prints), so it cannot drift from the binary. The test below fails when the
//! file is stale and names the command that rewrites it:
//! `GMLP_ONNX_UPDATE_DOCS=1 cargo test --bin gmlp-onnx cli_reference`.

use std::path::Path;

use super::Cli;

/// The file the reference is written to, relative to the repository root.
const REFERENCE: &str = "docs/cli.md";

/// The reference as Markdown: a note saying it is generated, then clap-markdown's page.
fn reference() -> String {
    let options = clap_markdown::MarkdownOptions::new()
        .title("gmlp-onnx command-line reference".to_string())
        .show_footer(false);
    let body = clap_markdown::help_markdown_custom::<Cli>(&options);
    format!(
        "<!-- Generated from the clap definitions in src/cli/; do not edit.\n     \
         Regenerate: GMLP_ONNX_UPDATE_DOCS=1 cargo test --bin gmlp-onnx cli_reference -->\n\n{body}"
    )
}

#[test]
fn cli_reference_is_up_to_date() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(REFERENCE);
    let fresh = reference();
    if std::env::var("GMLP_ONNX_UPDATE_DOCS").as_deref() == Ok("1") {
        std::fs::write(&path, &fresh).expect("write docs/cli.md");
        return;
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        current == fresh,
        "{REFERENCE} is stale (it differs from the clap definitions in src/cli/); regenerate it with \
         `GMLP_ONNX_UPDATE_DOCS=1 cargo test --bin gmlp-onnx cli_reference` and commit the result"
    );
}
